"""kvsift.cuda: the CUDA kernels on torch tensors. Skipped without the kvsift._kvsift_cuda
extension (built with KVSIFT_PY_CUDA=ON) or without a CUDA device; run on the H200."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
try:
    import kvsift.cuda as kc
except ImportError as e:
    pytest.skip(f"kvsift._kvsift_cuda not built: {e}", allow_module_level=True)
import kvsift  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def ref_merge(va, sa, vb, sb, base=math.e):
    """The merge in float64: lse = log(b^sa + b^sb), v = weights * v."""
    ln = math.log(base)
    sa, sb = sa.double() * ln, sb.double() * ln
    m = torch.maximum(sa, sb)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    lse = m + torch.log(torch.exp(sa - m) + torch.exp(sb - m))
    wa, wb = torch.exp(sa - lse), torch.exp(sb - lse)
    v = wa[..., None] * va.double() + wb[..., None] * vb.double()
    return v, lse / ln


def states(rows, heads, dim, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    v = torch.randn(rows, heads, dim, device="cuda", generator=g).to(dtype)
    s = torch.randn(rows, heads, device="cuda", generator=g) * 4
    return v, s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("base", ["e", 2])
def test_merge_state_matches_the_formula(dtype, base):
    va, sa = states(7, 32, 128, dtype, 1)
    vb, sb = states(7, 32, 128, dtype, 2)
    sb[0, 0] = -math.inf  # the empty state is the identity
    v, s = kc.merge_state(va, sa, vb, sb, lse_base=base)
    assert v.dtype == dtype and v.shape == va.shape and s.dtype == torch.float32
    rv, rs = ref_merge(va, sa, vb, sb, 2.0 if base == 2 else math.e)
    assert torch.allclose(v.double(), rv, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.allclose(s.double(), rs, atol=1e-5, rtol=1e-5)
    assert torch.equal(v[0, 0], va[0, 0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_operator_equals_the_dlpack_route(dtype):
    """kvsift._kvsift_torch (built with KVSIFT_PY_TORCH=ON) is what kvsift.cuda
    .merge_state takes for torch tensors with the defaults, and importing it registers
    torch.ops.kvsift.merge_state; both equal the DLPack route bit for bit, on the caller's
    current stream, and refuse bad input with kvsift.cuda's messages."""
    if kc._load_torch_ext() is None:
        pytest.skip("kvsift._kvsift_torch not built (KVSIFT_PY_TORCH=OFF)")
    va, sa = states(33, 8, 64, dtype, 21)
    vb, sb = states(33, 8, 64, dtype, 22)
    sa[3, 1] = -math.inf
    v_ref, s_ref = torch.empty_like(va), torch.empty_like(sa)
    kc._ext.merge_state(*kc._dl(va, sa, vb, sb, v_ref, s_ref),
                        torch.cuda.current_stream().cuda_stream)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        v, s = torch.ops.kvsift.merge_state(va, sa, vb, sb)
        v2, s2 = kc.merge_state(va, sa, vb, sb)
        out = (torch.full_like(va, 7.0), torch.full_like(sa, 7.0))
        v3, s3 = kc.merge_state(va, sa, vb, sb, out=out)  # into the caller's tensors
    side.synchronize()
    assert torch.equal(v, v_ref) and torch.equal(s, s_ref)
    assert torch.equal(v2, v_ref) and torch.equal(s2, s_ref)
    assert v3 is out[0] and s3 is out[1]
    assert torch.equal(v3, v_ref) and torch.equal(s3, s_ref)
    # lse_base=math.e: the default's value, not its spelling, so the DLPack route, with out=
    out2 = (torch.empty_like(va), torch.empty_like(sa))
    v4, s4 = kc.merge_state(va, sa, vb, sb, out=out2, lse_base=math.e)
    assert v4 is out2[0] and torch.equal(v4, v_ref) and torch.equal(s4, s_ref)
    with pytest.raises(ValueError, match="v_out: expected shape"):
        kc.merge_state(va, sa, vb, sb, out=(va[:1].clone(), sa.clone()))
    with pytest.raises(ValueError, match="s_out"):
        kc.merge_state(va, sa, vb, sb, out=(va.clone(), sa.half()))
    with pytest.raises(ValueError, match=r"x\.cuda\(\)"):
        torch.ops.kvsift.merge_state(va.cpu(), sa.cpu(), vb.cpu(), sb.cpu())
    with pytest.raises(ValueError, match="float32"):
        torch.ops.kvsift.merge_state(va, sa.double(), vb, sb)
    with pytest.raises(ValueError, match="dtype"):
        torch.ops.kvsift.merge_state(va, sa, vb.double(), sb)
    with pytest.raises(ValueError, match="v_b: expected shape"):
        torch.ops.kvsift.merge_state(va, sa, vb[:1].clone(), sb)
    other = torch.float32 if dtype != torch.float32 else torch.float16
    with pytest.raises(ValueError, match="v_out must have v_a's dtype"):
        kc.merge_state(va, sa, vb, sb, out=(va.to(other), sa.clone()))


def test_merge_state_in_place_writes_the_callers_tensor():
    va, sa = states(3, 8, 64, torch.float16, 3)
    vb, sb = states(3, 8, 64, torch.float16, 4)
    rv, rs = ref_merge(va, sa, vb, sb)
    ptr = va.data_ptr()
    kc.merge_state_in_place(va, sa, vb, sb)
    assert va.data_ptr() == ptr
    assert torch.allclose(va.double(), rv, atol=2e-3, rtol=2e-3)
    assert torch.allclose(sa.double(), rs, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_states_variable_length(dtype):
    v, s = states(10, 4, 128, dtype, 5)
    indptr = torch.tensor([0, 3, 3, 10], dtype=torch.int64, device="cuda")
    vo, so = kc.merge_states(v, s, indptr)
    assert vo.shape == (3, 4, 128) and so.shape == (3, 4)
    for p, (a, b) in enumerate([(0, 3), (3, 3), (3, 10)]):
        if a == b:
            assert torch.all(so[p] == -math.inf) and torch.all(vo[p] == 0)
            continue
        lse = torch.logsumexp(s[a:b].double(), dim=0)
        w = torch.exp(s[a:b].double() - lse)
        ref = (w[..., None] * v[a:b].double()).sum(0)
        assert torch.allclose(vo[p].double(), ref, atol=TOL[dtype], rtol=TOL[dtype])
        assert torch.allclose(so[p].double(), lse, atol=1e-5)


def paged(n, kv_heads, dim, page, dtype, seed):
    """K/V of kv_heads heads x n tokens in shuffled pages, and the dense copies for reference."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_head = (n + page - 1) // page
    num_pages = kv_heads * pages_per_head + 3
    k = torch.randn(num_pages, page, dim, device="cuda", generator=g).to(dtype)
    v = torch.randn(num_pages, page, dim, device="cuda", generator=g).to(dtype)
    perm = torch.randperm(num_pages, device="cuda", generator=g)[: kv_heads * pages_per_head]
    table = perm.view(kv_heads, pages_per_head).to(torch.int32).contiguous()
    kd = k[table.long()].reshape(kv_heads, pages_per_head * page, dim)[:, :n]
    vd = v[table.long()].reshape(kv_heads, pages_per_head * page, dim)[:, :n]
    return k, v, table, kd, vd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [0, 1, 3])
def test_sparse_attention_matches_dense_attention_over_the_listed_tokens(dtype, splits):
    n, kv_heads, group, dim, page = 300, 2, 4, 128, 16
    k, v, table, kd, vd = paged(n, kv_heads, dim, page, dtype, 6)
    heads = kv_heads * group
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(heads, dim, device="cuda", generator=g)
    lists = [torch.randint(0, n, (c,), device="cuda", generator=g) for c in
             [0, 1, 17, 150, 300, 5, 64, 299]]
    indptr = torch.tensor([0] + [len(x) for x in lists], device="cuda").cumsum(0).to(torch.int64)
    ids = torch.cat(lists).to(torch.int32)
    o, lse = kc.sparse_attention(q, k, v, table, indptr, ids, num_splits=splits)
    for h, x in enumerate(lists):
        if len(x) == 0:
            assert lse[h] == -math.inf and torch.all(o[h] == 0)
            continue
        kh, vh = kd[h // group][x].double(), vd[h // group][x].double()
        logits = (kh @ q[h].double()) / math.sqrt(dim)
        ref_lse = torch.logsumexp(logits, 0)
        ref_o = torch.softmax(logits, 0) @ vh
        assert torch.allclose(o[h].double(), ref_o, atol=1e-4, rtol=1e-4)
        assert abs(lse[h].item() - ref_lse.item()) < 1e-4
    o2, lse2 = kc.sparse_attention(q, k, v, table, indptr, ids, lse_base=2, num_splits=splits)
    finite = torch.isfinite(lse)
    assert torch.allclose(lse2[finite], lse[finite] / math.log(2.0), rtol=1e-6)


def test_runs_on_the_callers_current_stream_and_an_explicit_one():
    va, sa = states(64, 32, 128, torch.float16, 8)
    vb, sb = states(64, 32, 128, torch.float16, 9)
    rv, _ = ref_merge(va, sa, vb, sb)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        v, s = kc.merge_state(va, sa, vb, sb)
    side.synchronize()
    assert torch.allclose(v.double(), rv, atol=2e-3)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    v2, _ = kc.merge_state(va, sa, vb, sb, stream=other)
    other.synchronize()
    assert torch.equal(v, v2)


def test_status_word_reports_an_invalid_lse_and_the_row_comes_back_empty():
    va, sa = states(2, 4, 64, torch.float32, 10)
    vb, sb = states(2, 4, 64, torch.float32, 11)
    sa[1, 2] = math.nan
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    v, s = kc.merge_state(va, sa, vb, sb, status=status)
    assert status.item() != 0
    assert s[1, 2] == -math.inf and torch.all(v[1, 2] == 0)
    assert torch.isfinite(s[0]).all()


def test_bad_input_is_refused_with_the_fix_named():
    va, sa = states(2, 4, 64, torch.float32, 12)
    with pytest.raises(ValueError, match=r"x\.cuda\(\)"):
        kc.merge_state(va.cpu(), sa, va, sa)
    with pytest.raises(ValueError, match="float32"):
        kc.merge_state(va, sa.half(), va, sa)
    with pytest.raises(ValueError, match="contiguous"):
        kc.merge_state(va.transpose(0, 1), sa.t(), va.transpose(0, 1), sa.t())
    with pytest.raises(ValueError, match="shape"):
        kc.merge_state(va, sa, va[:1], sa[:1])
    with pytest.raises(ValueError, match="lse_base"):
        kc.merge_state(va, sa, va, sa, lse_base=10)
    q = torch.zeros(4, 64, device="cuda")
    k, v, table, _, _ = paged(32, 2, 64, 16, torch.float16, 13)
    indptr = torch.zeros(5, dtype=torch.int64, device="cuda")
    ids = torch.zeros(0, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="int32"):
        kc.sparse_attention(q, k, v, table.long(), indptr, ids)
    with pytest.raises(ValueError, match="head dim"):
        kc.sparse_attention(torch.zeros(4, 128, device="cuda"), k, v, table, indptr, ids)
    with pytest.raises(ValueError):  # 3 query heads over 2 KV heads: not a GQA grouping
        kc.sparse_attention(q[:3], k, v, table, indptr[:4], ids)
    with pytest.raises(ValueError, match="float32"):
        kc.sparse_attention(q.half(), k, v, table, indptr, ids)
    assert issubclass(kvsift.InvalidArgument, ValueError)


@pytest.mark.parametrize("block,result", [("cuda-merge", "v"), ("cuda-knn", "scores"),
                                          ("cuda-decode-step", "o"), ("cuda-decode-search", "ids"),
                                          ("cuda-batch-insert", "result"),
                                          ("cuda-route-seeds", "result")])
def test_readme_cuda_blocks_run_as_written(block, result):
    """python/README.md's `<!-- pytest: cuda-... -->` blocks, run as written."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    marker = readme.index(f"<!-- pytest: {block} -->")
    start = readme.index("```python\n", marker) + len("```python\n")
    snippet = readme[start : readme.index("```", start)]
    scope = {}
    exec(compile(snippet, f"python/README.md:{block}", "exec"), scope)
    out = scope[result]
    assert (out.ids if hasattr(out, "ids") else out).is_cuda


@pytest.mark.parametrize("dtype", DTYPES)
def test_knn_matches_torch_topk(dtype):
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(37, 64, device="cuda", generator=g).to(dtype)
    x = torch.randn(5000, 64, device="cuda", generator=g).to(dtype)
    scores, ids = kc.knn(q, x, 50)
    assert scores.shape == (37, 50) and scores.dtype == torch.float32
    assert ids.shape == (37, 50) and ids.dtype == torch.int32
    ref = q.float() @ x.float().T  # the GEMM's f32 accumulation of the same inputs
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    # The returned scores are the ids' scores, best first, and as good as torch's top-k
    # (ids themselves may differ on near-ties of summation order).
    assert torch.allclose(scores, ref.gather(1, ids.long()), atol=tol, rtol=tol)
    assert bool((scores[:, :-1] >= scores[:, 1:]).all())
    want = ref.topk(50, dim=1).values
    assert torch.allclose(scores, want, atol=tol, rtol=tol)
    assert all(len(set(r)) == 50 for r in ids.tolist())


def test_knn_on_an_explicit_stream_and_all_keys():
    s = torch.cuda.Stream()
    q = torch.randn(3, 32, device="cuda")
    x = torch.randn(40, 32, device="cuda")
    x[7] = float("nan")  # NaN scores rank last
    s.wait_stream(torch.cuda.current_stream())  # q and x were written on the current stream
    scores, ids = kc.knn(q, x, 40, stream=s)
    s.synchronize()
    assert ids[:, -1].tolist() == [7, 7, 7]
    assert sorted(ids[0].tolist()) == list(range(40))


def test_knn_refuses_bad_input():
    q = torch.randn(4, 32, device="cuda")
    x = torch.randn(100, 32, device="cuda")
    with pytest.raises(ValueError, match="k"):
        kc.knn(q, x, 101)
    with pytest.raises(ValueError, match="k"):
        kc.knn(q, x, 0)
    with pytest.raises(ValueError, match="dtype"):
        kc.knn(q, x.half(), 5)
    with pytest.raises(ValueError, match="dim"):
        kc.knn(q, torch.randn(100, 16, device="cuda"), 5)
    with pytest.raises(ValueError, match=r"x\.cuda\(\)"):
        kc.knn(q.cpu(), x, 5)
    with pytest.raises(ValueError, match="contiguous"):
        kc.knn(q, torch.randn(32, 100, device="cuda").T, 5)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kc.knn(q.double(), x.double(), 5)
    with pytest.raises(ValueError):
        kc.knn(q[:0], x, 5)  # no queries
    with pytest.raises(ValueError, match="1024"):
        kc.knn(q, torch.randn(2000, 32, device="cuda"), 1025)


def test_gather_and_scatter_pages_copy_whole_pages():
    host = torch.randn(10, 4, 64, dtype=torch.float16).pin_memory()  # 512-byte pages
    dev = torch.zeros(6, 4, 64, dtype=torch.float16, device="cuda")
    copies = torch.tensor([[3, 0], [7, 5], [0, 2]], dtype=torch.int64, device="cuda")
    kc.gather_pages(copies, host, dev)
    torch.cuda.synchronize()
    for cpu_page, gpu_page in [(3, 0), (7, 5), (0, 2)]:
        assert torch.equal(dev[gpu_page].cpu(), host[cpu_page])
    for gpu_page in (1, 3, 4):
        assert not dev[gpu_page].any()
    dev[5] = 1.0
    back = torch.tensor([[9, 5]], dtype=torch.int64, device="cuda")
    kc.scatter_pages(back, host, dev)
    torch.cuda.synchronize()
    assert bool((host[9] == 1.0).all())
    assert torch.equal(dev[0].cpu(), host[3])  # scatter leaves the device pool as it was


def test_gather_pages_reports_a_page_out_of_range_and_skips_it():
    host = torch.arange(4 * 8, dtype=torch.float32).view(4, 8).pin_memory()  # 32-byte pages
    dev = torch.zeros(2, 8, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    copies = torch.tensor([[4, 0], [1, 1]], dtype=torch.int64, device="cuda")  # host page 4: none
    kc.gather_pages(copies, host, dev, status=status)
    torch.cuda.synchronize()
    assert status.item() == 1
    assert not dev[0].any() and torch.equal(dev[1].cpu(), host[1])


def test_page_copies_refuse_bad_input():
    pinned = torch.zeros(4, 16).pin_memory()
    dev = torch.zeros(4, 16, device="cuda")
    copies = torch.zeros(1, 2, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="pin_memory"):
        kc.gather_pages(copies, torch.zeros(4, 16), dev)  # pageable
    with pytest.raises(ValueError, match="int64"):
        kc.gather_pages(copies.int(), pinned, dev)
    with pytest.raises(ValueError, match="bytes"):
        kc.gather_pages(copies, pinned, torch.zeros(4, 8, device="cuda"))
    with pytest.raises(ValueError, match="host memory"):
        kc.gather_pages(copies, dev, dev)
    with pytest.raises(ValueError, match="count, 2"):
        kc.gather_pages(torch.zeros(3, dtype=torch.int64, device="cuda"), pinned, dev)
    with pytest.raises(ValueError, match=r"x\.cuda\(\)"):
        kc.gather_pages(copies, pinned, pinned)


def lru_step(lru, per_pair, limits=None):
    """Runs one step with pair p selecting per_pair[p] (and, given, limit limits[p]); returns
    the step and the host offsets."""
    flat = [p for sel in per_pair for p in sel]
    offsets = [0]
    for sel in per_pair:
        offsets.append(offsets[-1] + len(sel))
    lim = None if limits is None else torch.tensor(limits, dtype=torch.int32, device="cuda")
    r = lru.step(torch.tensor(flat, dtype=torch.int32, device="cuda"),
                 torch.tensor(offsets, dtype=torch.int64, device="cuda"), limits=lim)
    torch.cuda.synchronize()
    return r, offsets


def test_bucketed_lru_admits_then_evicts_the_page_not_selected():
    lru = kc.BucketedLRU(1, 2, 8, buckets=4)
    r, _ = lru_step(lru, [[0, 1]])
    assert r.status.tolist() == [0] and r.counts.tolist() == [[0, 0, 2]]
    assert sorted(r.admitted_keys[:2].tolist()) == [0, 1]
    assert sorted(r.admitted_slots[:2].tolist()) == [0, 1]
    slot0 = lru.slot_of[0, 0].item()
    r, _ = lru_step(lru, [[1, 2]])  # page 1 hits; page 0, the only other, must make room
    assert r.counts.tolist() == [[1, 1, 1]]
    assert r.evicted_keys[:1].tolist() == [0] and r.evicted_slots[:1].tolist() == [slot0]
    assert r.admitted_keys[:1].tolist() == [2] and r.admitted_slots[:1].tolist() == [slot0]
    assert lru.slot_of[0, 0].item() == -1 and lru.slot_of[0, 2].item() == slot0


def test_bucketed_lru_keeps_its_page_table_consistent_on_a_random_trace():
    pairs, capacity, pages = 6, 16, 64
    lru = kc.BucketedLRU(pairs, capacity, pages, buckets=8)
    g = torch.Generator().manual_seed(5)
    resident = [set() for _ in range(pairs)]
    for _ in range(40):
        per_pair = [torch.randint(0, pages, (int(torch.randint(0, capacity + 1, (1,), generator=g)),),
                                  generator=g).tolist() for _ in range(pairs)]
        r, off = lru_step(lru, per_pair)
        assert r.status.tolist() == [0] * pairs
        counts = r.counts.tolist()
        for p in range(pairs):
            want = set(per_pair[p])
            hits, ev, ad = counts[p]
            assert hits == len(want & resident[p]) and ad == len(want - resident[p])
            evicted = set(r.evicted_keys[off[p]: off[p] + ev].tolist())
            admitted = set(r.admitted_keys[off[p]: off[p] + ad].tolist())
            assert admitted == want - resident[p] and not (evicted & want)
            assert evicted <= resident[p]
            resident[p] = (resident[p] - evicted) | admitted
            assert len(resident[p]) <= capacity and want <= resident[p]
    slot_of, keys = lru.slot_of.cpu(), lru.keys.cpu()
    for p in range(pairs):
        held = {(int(k), s) for s, k in enumerate(keys[p].tolist()) if k >= 0}
        assert {k for k, _ in held} == resident[p]
        assert all(slot_of[p, k].item() == s for k, s in held)
        assert int((slot_of[p] >= 0).sum()) == len(resident[p])


def test_bucketed_lru_limits_shrink_pairs_by_their_oldest_pages():
    # Per-pair limits (buffer elasticity): a lowered limit evicts the pair's oldest pages at the
    # next step, even an empty one; evictions sit in the pair's own range of `capacity`.
    lru = kc.BucketedLRU(2, 4, 16, buckets=8)
    lru_step(lru, [[0, 1], [8]])
    lru_step(lru, [[2, 3], [9]])  # pair 0 holds 0, 1 (older) and 2, 3 (newer)
    r, _ = lru_step(lru, [[], []], [2, 4])
    assert r.eviction_stride == 4 and r.status.tolist() == [0, 0]
    assert r.counts.tolist() == [[0, 2, 0], [0, 0, 0]]
    assert sorted(r.evicted_keys[0:2].tolist()) == [0, 1]
    assert lru.slot_of[0, 0].item() == -1 and lru.slot_of[0, 2].item() >= 0
    # Pair 1 at limit 1 must drop 8 and 9 to admit 10: more evictions than it selected pages.
    r, _ = lru_step(lru, [[2], [10]], [2, 1])
    assert r.status.tolist() == [0, 0] and r.counts.tolist() == [[1, 0, 0], [0, 2, 1]]
    assert sorted(r.evicted_keys[4:6].tolist()) == [8, 9]
    assert int((lru.slot_of[1] >= 0).sum()) == 1
    # A selection above the limit is refused (2), a limit above the capacity too (3);
    # neither pair changes.
    keys = lru.keys.clone()
    r, _ = lru_step(lru, [[4, 5, 6], [11]], [2, 5])
    assert r.status.tolist() == [2, 3] and torch.equal(lru.keys, keys)
    with pytest.raises(ValueError, match="limits"):
        lru.step(torch.zeros(1, dtype=torch.int32, device="cuda"),
                 torch.tensor([0, 1, 1], dtype=torch.int64, device="cuda"),
                 limits=torch.ones(3, dtype=torch.int32, device="cuda"))


def test_bucketed_lru_with_limits_at_capacity_steps_as_without():
    # limits == capacity everywhere: the same residency as no limits on a random trace (only
    # where the evictions are written differs).
    pairs, capacity, pages = 5, 8, 40
    a = kc.BucketedLRU(pairs, capacity, pages, buckets=8)
    b = kc.BucketedLRU(pairs, capacity, pages, buckets=8)
    g = torch.Generator().manual_seed(9)
    for _ in range(30):
        per_pair = [torch.randint(0, pages, (int(torch.randint(0, capacity + 1, (1,), generator=g)),),
                                  generator=g).tolist() for _ in range(pairs)]
        ra, off = lru_step(a, per_pair)
        rb, _ = lru_step(b, per_pair, [capacity] * pairs)
        assert torch.equal(ra.counts, rb.counts) and torch.equal(ra.status, rb.status)
        for p in range(pairs):
            ev = ra.counts[p, 1].item()
            assert torch.equal(ra.evicted_keys[off[p]: off[p] + ev],
                               rb.evicted_keys[p * capacity: p * capacity + ev])
        assert torch.equal(a.keys, b.keys) and torch.equal(a.slot_of, b.slot_of)


def test_bucketed_lru_reports_bad_selections_per_pair_and_refuses_bad_shapes():
    lru = kc.BucketedLRU(2, 2, 8)
    r, _ = lru_step(lru, [[9], [0, 1, 2]])  # pair 0: page 9 >= 8; pair 1: 3 pages > 2 slots
    assert r.status.tolist() == [1, 2]
    assert not bool((lru.keys >= 0).any())  # neither pair changed
    r, _ = lru_step(lru, [[], [3]])  # an empty selection is a step too
    assert r.status.tolist() == [0, 0] and r.counts.tolist() == [[0, 0, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match="capacity"):
        kc.BucketedLRU(1, 8193, 8)
    with pytest.raises(ValueError, match="buckets"):
        kc.BucketedLRU(1, 4, 8, buckets=1)
    with pytest.raises(ValueError, match="int32"):
        lru.step(torch.zeros(2, dtype=torch.int64, device="cuda"),
                 torch.zeros(3, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="shape"):
        lru.step(torch.zeros(2, dtype=torch.int32, device="cuda"),
                 torch.zeros(4, dtype=torch.int64, device="cuda"))


def decode_case(dtype, n=600, kv_heads=2, group=4, dim=64, page=16, seed=11):
    """Two KV heads of n tokens: RoarGraph indexes over their keys, the paged K/V, queries."""
    k, v, table, kd, vd = paged(n, kv_heads, dim, page, dtype, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(kv_heads * group, dim, device="cuda", generator=g)
    idx = []
    for h in range(kv_heads):
        keys = kd[h].float().cpu().numpy()
        train = q[h * group : (h + 1) * group].cpu().numpy().repeat(40, 0)
        train = train + 0.3 * np.random.default_rng(h).standard_normal(train.shape).astype(np.float32)
        idx.append(kvsift.RoarGraphIndex(keys, train, nq=20, M=16, L=80, threads=1))
    gs = kc.graph_set(idx)
    dev = kc.GraphSet(*(torch.from_numpy(a).cuda() for a in gs[:3]), gs.max_keys)
    return dev, q, k, v, table, kd, vd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("expand_width", [1, 8])
def test_decode_step_with_full_retrieval_is_full_attention(dtype, expand_width):
    # A pool as large as the middle (every token but the window) retrieves all of it, so window
    # + retrieval (one attention pass over both) must be attention over every token.
    n, group, dim = 600, 4, 64
    graphs, q, k, v, table, kd, vd = decode_case(dtype)
    middle = n - 4 - 64
    o, lse = kc.decode_step(graphs, q, k, v, table, k=middle, L=middle, sink=4, window=64,
                            expand_width=expand_width)
    for h in range(q.shape[0]):
        kh, vh = kd[h // group].double(), vd[h // group].double()
        logits = (kh @ q[h].double()) / math.sqrt(dim)
        assert abs(lse[h].item() - torch.logsumexp(logits, 0).item()) < 1e-4
        assert torch.allclose(o[h].double(), torch.softmax(logits, 0) @ vh, atol=1e-4, rtol=1e-4)
    o2, lse2 = kc.decode_step(graphs, q, k, v, table, k=middle, L=middle, sink=4, window=64,
                              expand_width=expand_width, lse_base=2)
    assert torch.allclose(lse2, lse / math.log(2.0), rtol=1e-6)


def test_decode_step_top_k_attends_the_window_and_the_best_keys():
    # Small k: the output must be attention over the window + the k keys the search found,
    # which for these easy queries are the exact top-k of the middle (recall checked loosely).
    n, group, dim = 600, 4, 64
    graphs, q, k, v, table, kd, vd = decode_case(torch.float16, seed=21)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    o, lse = kc.decode_step(graphs, q, k, v, table, k=32, L=96, sink=4, window=64,
                            expand_width=8, walk_through=False, status=status)
    torch.cuda.synchronize()
    assert status.item() == 0 and torch.all(torch.isfinite(o)) and torch.all(torch.isfinite(lse))
    full_lse = []
    for h in range(q.shape[0]):
        logits = (kd[h // group].double() @ q[h].double()) / math.sqrt(dim)
        full_lse.append(torch.logsumexp(logits, 0).item())
        window = torch.cat([logits[:4], logits[n - 64 :]])
        # At least the window's mass, at most the full mass.
        assert torch.logsumexp(window, 0).item() - 1e-4 <= lse[h].item() <= full_lse[-1] + 1e-4


def test_decode_step_capped_dipr_heads_attend_every_token():
    # Every DIPR search caps (an unbounded beta and a cap of 16 below the middle's 532 tokens):
    # with dense_when_capped each head attends all its tokens, full attention; without (the
    # default), the window and 16 keys, which hold less than the full softmax mass.
    n, group, dim = 600, 4, 64
    graphs, q, k, v, table, kd, vd = decode_case(torch.float16, seed=31)
    args = dict(mode="dipr", beta=1e30, l0=16, max_results=16, sink=4, window=64)
    flags = torch.full((q.shape[0],), 7, dtype=torch.int32, device="cuda")
    o, lse = kc.decode_step(graphs, q, k, v, table, dense_when_capped=True, capped=flags, **args)
    assert bool((flags == 1).all())  # the step says which heads were capped: all of them here
    _, lse_capped = kc.decode_step(graphs, q, k, v, table, **args)
    flags.fill_(7)
    kc.decode_step(graphs, q, k, v, table, sink=4, window=64, k=16, L=32, capped=flags)
    assert bool((flags == 0).all())  # top-k is never capped
    with pytest.raises(Exception, match="capped"):
        kc.decode_step(graphs, q, k, v, table, capped=flags[:3].contiguous(), **args)
    for h in range(q.shape[0]):
        kh, vh = kd[h // group].double(), vd[h // group].double()
        logits = (kh @ q[h].double()) / math.sqrt(dim)
        full = torch.logsumexp(logits, 0).item()
        assert abs(lse[h].item() - full) < 1e-4
        assert torch.allclose(o[h].double(), torch.softmax(logits, 0) @ vh, atol=1e-4, rtol=1e-4)
        assert lse_capped[h].item() < full - 1e-3


def test_decode_step_dipr_seed_from_window_measures_the_range_from_the_window():
    # seed_from_window: every retrieved token is within beta of the best of the window and the
    # middle together (raw q.k); unseeded, the range is measured from the middle's best alone, so
    # where the window holds the best key some head retrieves tokens below that bound. Without
    # the walk-through the retrieval stays inside the middle and within the same bound.
    n, group, dim, sink, window, beta = 600, 4, 64, 4, 300, 2.5
    graphs, q, k, v, table, kd, vd = decode_case(torch.float16, seed=17)
    heads = q.shape[0]
    args = dict(mode="dipr", beta=beta, l0=16, max_results=1024, sink=sink, window=window)
    below = {}
    for seeded, through in ((False, True), (True, True), (True, False)):
        carry = torch.full((heads, 1024), -1, dtype=torch.int32, device="cuda")
        kc.decode_step(graphs, q, k, v, table, carry=carry, seed_from_window=seeded,
                       walk_through=through, **args)
        torch.cuda.synchronize()
        count = 0
        for h in range(heads):
            raw = kd[h // group].double() @ q[h].double()
            ids = carry[h][carry[h] >= 0].long().cpu()
            assert bool(((ids >= sink) & (ids < n - window)).all())
            top = torch.cat([raw[:sink], raw[n - window:], raw[ids]]).max().item()
            count += int((raw[ids] < top - beta - 1e-3).sum())
        below[(seeded, through)] = count
    assert below[(True, True)] == 0 and below[(True, False)] == 0
    assert below[(False, True)] > 0


def test_decode_step_carry_is_the_search_and_its_seeds():
    # A carry of -1 is the cold step (same output) and comes back holding each head's
    # retrieved ids (the middle only); passed again it seeds the next step's search, so with
    # expand_limit 1 the step still finds the same keys (the cold search at that limit does not).
    n, dim = 600, 64
    graphs, q, k, v, table, kd, vd = decode_case(torch.float16, seed=5)
    heads, kk = q.shape[0], 16
    args = dict(k=kk, L=48, sink=4, window=64, walk_through=False)
    o, lse = kc.decode_step(graphs, q, k, v, table, **args)
    carry = torch.full((heads, kk), -1, dtype=torch.int32, device="cuda")
    o1, lse1 = kc.decode_step(graphs, q, k, v, table, carry=carry, **args)
    assert torch.equal(o1, o) and torch.equal(lse1, lse)
    found = carry.clone()
    assert bool(((found >= 4) & (found < n - 64)).all())
    o2, _ = kc.decode_step(graphs, q, k, v, table, carry=carry, expand_limit=1, **args)
    assert torch.equal(torch.sort(carry, 1).values, torch.sort(found, 1).values)
    cold = torch.full((heads, kk), -1, dtype=torch.int32, device="cuda")
    kc.decode_step(graphs, q, k, v, table, carry=cold, expand_limit=1, **args)
    assert not torch.equal(torch.sort(cold, 1).values, torch.sort(found, 1).values)
    with pytest.raises(Exception, match=r"carry: expected shape \(%d, %d\)" % (heads, kk)):
        kc.decode_step(graphs, q, k, v, table, carry=carry[:, :4].contiguous(), **args)


def test_decode_search_capacity_is_the_row_length_the_library_uses():
    # The ids' row length of decode_search, and the carry decode_step takes, for top-k and for
    # DIPR with and without max_results; bad parameters are refused as decode_search refuses them.
    graphs, q, k, v, table, _, _ = decode_case(torch.float16, n=200)
    for kw in (dict(mode="topk", k=16, L=48), dict(mode="dipr", l0=16),
               dict(mode="dipr", l0=16, max_results=300)):
        cap = kc.decode_search_capacity(**kw)
        assert kc.decode_search(graphs, q, pages=(k, table), **kw).ids.shape[1] == cap
        carry = torch.full((q.shape[0], cap), -1, dtype=torch.int32, device="cuda")
        kc.decode_step(graphs, q, k, v, table, sink=4, window=16, carry=carry, **kw)
    assert kc.decode_search_capacity(mode="dipr", l0=16) == 64 * 16
    with pytest.raises(Exception, match="<= L"):
        kc.decode_search_capacity(k=100, L=50)
    with pytest.raises(Exception, match="'topk' or 'dipr'"):
        kc.decode_search_capacity(mode="flat")


def test_decode_step_refuses_bad_input():
    graphs, q, k, v, table, _, _ = decode_case(torch.float16, n=200)
    host = kc.GraphSet(*(a.cpu().numpy() for a in graphs[:3]), graphs.max_keys)
    with pytest.raises(Exception, match="numpy.ndarray"):
        kc.decode_step(host, q, k, v, table)
    with pytest.raises(Exception, match="'topk' or 'dipr'"):
        kc.decode_step(graphs, q, k, v, table, mode="flat")
    with pytest.raises(Exception, match="page_table"):
        kc.decode_step(graphs, q, k, v, table[:1].contiguous())
    for bad in (0, 10**9):  # outside [1, adjacency rows]: refused before a workspace is sized
        with pytest.raises(Exception, match="max_keys"):
            kc.decode_step(kc.GraphSet(*graphs[:3], bad), q, k, v, table)
    with pytest.raises(Exception, match="float32"):
        kc.decode_step(graphs, q.half(), k, v, table)


def search_case(n=700, graphs=2, group=4, dim=32, page=16, seed=5):
    """Integer-valued keys and queries (every score exact in f32, f16 and bf16 alike, so the GPU
    and the CPU rank identically, ties by id), one RoarGraph index per graph, and the keys as
    one dense matrix and as shuffled pages."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(-4, 5, size=(graphs, n, dim)).astype(np.float32)
    q = rng.integers(-4, 5, size=(graphs * group, dim)).astype(np.float32)
    idx = []
    for h in range(graphs):
        train = np.repeat(q[h * group : (h + 1) * group], 30, 0)
        train = train + rng.integers(-2, 3, size=train.shape).astype(np.float32)
        idx.append(kvsift.RoarGraphIndex(keys[h], train, nq=20, M=12, L=60, threads=1))
    gs = kc.graph_set(idx)
    dev = kc.GraphSet(*(torch.from_numpy(a).cuda() for a in gs[:3]), gs.max_keys)
    pages_per_graph = (n + page - 1) // page
    num_pages = graphs * pages_per_graph + 2
    pool = torch.zeros(num_pages, page, dim)
    perm = torch.from_numpy(rng.permutation(num_pages)[: graphs * pages_per_graph])
    table = perm.view(graphs, pages_per_graph).to(torch.int32)
    for h in range(graphs):
        for p in range(pages_per_graph):
            rows = torch.from_numpy(keys[h, p * page : min(n, (p + 1) * page)])
            pool[table[h, p], : rows.shape[0]] = rows
    return idx, dev, keys, q, pool.cuda(), table.cuda()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_decode_search_equals_the_cpu_walk(dtype, layout):
    # expand_width 1 is the CPU's walk: ids, scores and vectors scored must be the CPU's, for
    # top-k at a pool small enough that the walk routes (it scores a fraction of the keys).
    idx, graphs, keys, q, pool, table = search_case()
    group = q.shape[0] // len(idx)
    qd = torch.from_numpy(q).cuda()
    where = (dict(keys=torch.from_numpy(keys.reshape(-1, keys.shape[2])).cuda().to(dtype))
             if layout == "dense" else dict(pages=(pool.to(dtype), table)))
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    r = kc.decode_search(graphs, qd, **where, k=10, L=20, status=status)
    torch.cuda.synchronize()
    assert status.item() == 0
    scored = 0
    for i in range(q.shape[0]):
        cpu = idx[i // group].search(q[i], 10, L=20)
        assert r.counts[i].item() == 10
        assert np.array_equal(r.ids[i].cpu().numpy(), cpu.ids.astype(np.int32))
        assert np.array_equal(r.scores[i].cpu().numpy(), cpu.scores)
        assert r.scored[i].item() == int(cpu.distance_computations[0])
        scored += r.scored[i].item()
    assert scored < 0.5 * q.shape[0] * keys.shape[1]  # the walk routed, it did not scan
    # DIPR: the same in-range set (the GPU returns it in discovery order) and best score.
    # With a cap of 16 results, or of 5 hops, some searches stop at it: each query's capped
    # flag is the CPU's.
    capped = 0
    for cap, hops in ((0, 0), (16, 0), (0, 5)):
        r = kc.decode_search(graphs, qd, **where, mode="dipr", beta=6.0, l0=16, max_results=cap,
                             max_hops=hops)
        for i in range(q.shape[0]):
            cpu = idx[i // group].dipr(q[i], 6.0, l0=16, max_candidates=cap, max_hops=hops)
            got = np.sort(r.ids[i, : r.counts[i].item()].cpu().numpy())
            assert np.array_equal(got, np.sort(cpu.ids.astype(np.int32)))
            assert r.best[i].item() == cpu.best_score
            assert r.capped[i].item() == int(cpu.capped)
            capped += int(cpu.capped)
    assert capped > 0


def test_decode_search_entry_prefix_equals_the_cpu():
    # entry_prefix enters each search at its graph's first ids too (a decode step's sinks): with
    # expand_width 1 the CPU's search with the same entry_prefix, filtered to a step's range
    # (the prefix's ids then fail and are walked through) with and without the walk-through.
    idx, graphs, keys, q, pool, table = search_case()
    group = q.shape[0] // len(idx)
    n = keys.shape[1]
    qd = torch.from_numpy(q).cuda()
    first = torch.full((q.shape[0],), 4, dtype=torch.int32, device="cuda")
    last = torch.full((q.shape[0],), n - 32, dtype=torch.int32, device="cuda")
    changed = 0
    for through in (True, False):
        r = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, walk_through=through,
                             id_range=(first, last), entry_prefix=4)
        plain = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20,
                                 walk_through=through, id_range=(first, last))
        for i in range(q.shape[0]):
            cpu = idx[i // group].search(q[i], 10, L=20, filter=kvsift.IdRange(4, n - 32),
                                         walk_through=through, entry_prefix=4)
            assert np.array_equal(r.ids[i].cpu().numpy(), cpu.ids.astype(np.int32))
            assert r.scored[i].item() == int(cpu.distance_computations[0])
            changed += int(r.scored[i].item() != plain.scored[i].item())
    assert changed > 0  # the prefix changes walks: the comparison is not vacuous


def test_decode_search_seeds_and_expand_limit_equal_the_cpu():
    # Per-query seeds (the previous step's ids as returned, -1 padding included) and
    # expand_limit: with expand_width 1 the CPU's search with the same entries and limit.
    idx, graphs, keys, q, pool, table = search_case(seed=4)
    group = q.shape[0] // len(idx)
    qd = torch.from_numpy(q).cuda()
    first = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20)
    seeds = first.ids.clone()
    seeds[:, 7:] = -1  # padding, as a short previous row would have
    for limit in (0, 2, 8):
        r = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, seeds=seeds,
                             expand_limit=limit)
        cold = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, expand_limit=limit)
        for i in range(q.shape[0]):
            own = seeds[i].cpu().numpy()
            own = own[own >= 0].astype(np.uint32)
            cpu = idx[i // group].search(q[i], 10, L=20, entries=own, expand_limit=limit)
            assert np.array_equal(r.ids[i].cpu().numpy(), cpu.ids.astype(np.int32))
            assert r.scored[i].item() == int(cpu.distance_computations[0])
        if limit == 2:  # the seeds change the walk: the comparison is not vacuous
            assert not torch.equal(r.scored, cold.scored)
    with pytest.raises(Exception, match="seeds: expected int32 or uint32"):
        kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, seeds=seeds.float())
    with pytest.raises(Exception, match="expand_limit <= L = 20"):
        kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, expand_limit=21)


def test_decode_search_max_hops_caps_the_walk():
    # max_hops stops each top-k walk after that many expanded nodes (the C++ tests hold it to
    # the CPU's capped search id for id): a cap above every walk changes nothing, a small one
    # scores fewer vectors for every query; decode_step takes it too; a negative cap is
    # refused (DIPR takes the cap as well: test_decode_search_equals_the_cpu_walk).
    idx, graphs, keys, q, pool, table = search_case()
    qd = torch.from_numpy(q).cuda()
    where = dict(pages=(pool, table))
    free = kc.decode_search(graphs, qd, **where, k=10, L=40)
    huge = kc.decode_search(graphs, qd, **where, k=10, L=40, max_hops=100000)
    assert torch.equal(free.ids, huge.ids) and torch.equal(free.scored, huge.scored)
    capped = kc.decode_search(graphs, qd, **where, k=10, L=40, max_hops=3)
    assert bool((capped.scored < free.scored).all())
    wide = kc.decode_search(graphs, qd, **where, k=10, L=40, expand_width=8, max_hops=12)
    assert bool((wide.scored <= kc.decode_search(graphs, qd, **where, k=10, L=40,
                                                 expand_width=8).scored).all())
    with pytest.raises(ValueError, match="max_hops >= 0"):
        kc.decode_search(graphs, qd, **where, k=10, L=40, max_hops=-1)


def test_decode_search_id_range_and_csr():
    idx, graphs, keys, q, pool, table = search_case(seed=9)
    m, n, group = q.shape[0], keys.shape[1], q.shape[0] // len(idx)
    qd = torch.from_numpy(q).cuda()
    dense = torch.from_numpy(keys.reshape(-1, keys.shape[2])).cuda()
    first = torch.full((m,), 100, dtype=torch.int32, device="cuda")
    last = torch.full((m,), n - 64, dtype=torch.int32, device="cuda")
    r = kc.decode_search(graphs, qd, dense, k=10, L=20, id_range=(first, last))
    for i in range(m):
        cpu = idx[i // group].search(q[i], 10, L=20, filter=kvsift.IdRange(100, n - 64))
        assert np.array_equal(r.ids[i].cpu().numpy(), cpu.ids.astype(np.int32))
    # An explicit graph per query (here: every query on graph 1) instead of the GQA order.
    one = torch.ones(m, dtype=torch.int32, device="cuda")
    r1 = kc.decode_search(graphs, qd, dense, graph=one, k=10, L=20)
    for i in range(m):
        assert np.array_equal(r1.ids[i].cpu().numpy(), idx[1].search(q[i], 10, L=20).ids)
    indptr, indices = kc.results_to_csr(r)
    counts = r.counts.long()
    assert torch.equal(indptr, torch.cat([torch.zeros(1, device="cuda").long(), counts.cumsum(0)]))
    for i in range(m):
        row = indices[indptr[i] : indptr[i + 1]]
        assert torch.equal(row, r.ids[i, : counts[i]])


def test_decode_search_reports_a_graph_out_of_range():
    idx, graphs, keys, q, pool, table = search_case(n=200)
    qd = torch.from_numpy(q).cuda()
    bad = torch.full((q.shape[0],), 7, dtype=torch.int32, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    r = kc.decode_search(graphs, qd, pages=(pool, table), graph=bad, k=5, L=10, status=status)
    torch.cuda.synchronize()
    assert status.item() & 1 and int(r.counts.sum()) == 0


def test_decode_search_refuses_bad_input():
    idx, graphs, keys, q, pool, table = search_case(n=200)
    qd = torch.from_numpy(q).cuda()
    dense = torch.from_numpy(keys.reshape(-1, keys.shape[2])).cuda()
    with pytest.raises(ValueError, match="neither"):
        kc.decode_search(graphs, qd)
    with pytest.raises(ValueError, match="both"):
        kc.decode_search(graphs, qd, dense, pages=(pool, table))
    with pytest.raises(Exception, match="keys: expected shape"):
        kc.decode_search(graphs, qd, dense[1:].contiguous())
    with pytest.raises(Exception, match="'ip' or 'l2'"):
        kc.decode_search(graphs, qd, dense, metric="cos")
    with pytest.raises(Exception, match="'topk' or 'dipr'"):
        kc.decode_search(graphs, qd, dense, mode="flat")
    with pytest.raises(Exception, match="got L = 5"):
        kc.decode_search(graphs, qd, dense, k=10, L=5)
    with pytest.raises(ValueError, match="multiple of the graphs"):
        kc.decode_search(graphs, qd[:3].contiguous(), dense)
    with pytest.raises(Exception, match="graph: expected int32"):
        kc.decode_search(graphs, qd, dense, graph=torch.zeros(q.shape[0], device="cuda"))
    with pytest.raises(Exception, match="filter_last"):
        first = torch.zeros(q.shape[0], dtype=torch.int32, device="cuda")
        kc.decode_search(graphs, qd, dense, id_range=(first, first[:2]))
    with pytest.raises(Exception, match="numpy.ndarray"):
        kc.decode_search(graphs, qd, keys.reshape(-1, keys.shape[2]))
    with pytest.raises(Exception, match="float32"):
        kc.decode_search(graphs, qd.half(), dense)
    for bad in (0, 10**9):
        with pytest.raises(Exception, match="max_keys"):
            kc.decode_search(kc.GraphSet(*graphs[:3], bad), qd, dense)


def insert_case(n=500, base=350, graphs=2, dim=16, m=121, seed=21, H=8, C=64):
    """Integer keys and training queries (every score exact in f32): one InsertableGraphIndex per
    graph over its first `base` keys, with caps on the gathered queries (C) and on the key ->
    query lists (H) that bind; the keys also as shuffled pages (page-table row g = graph g)."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(-4, 5, size=(graphs, n, dim)).astype(np.float32)
    train = rng.integers(-4, 5, size=(graphs, m, dim)).astype(np.float32)
    cpu = [kvsift.InsertableGraphIndex(keys[g, :base], train[g], nq=20, M=6, L=32, threads=1,
                                       insert_L=24, query_candidates=C, holder_capacity=H)
           for g in range(graphs)]
    page = 16
    per = (n + page - 1) // page
    pool = torch.zeros(graphs * per + 3, page, dim)
    table = torch.from_numpy(rng.permutation(graphs * per + 3)[: graphs * per]).view(graphs, per)
    for g in range(graphs):
        for p in range(per):
            rows = torch.from_numpy(keys[g, p * page : min(n, (p + 1) * page)])
            pool[table[g, p], : rows.shape[0]] = rows
    return keys, cpu, pool.cuda(), table.to(torch.int32).cuda()


def _dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_batch_insert_equals_the_cpu_insert(layout):
    # With the CPU's walk (expand_width 1) and exact scores, one launch per key into both graphs
    # must leave each graph, its size and its training queries' kNN lists as the CPU insert
    # leaves them, id for id; the grown graphs then search as the CPU's grown index does.
    n, base, m, H, C = 500, 350, 121, 8, 64
    keys, cpu, pool, table = insert_case(n, base, m=m, H=H, C=C)
    G, dim = keys.shape[0], keys.shape[2]
    graphs = kc.graph_set(cpu, capacity=n).map(_dev)
    state = kc.insert_state(cpu, capacity=n, holder_capacity=H).map(_dev)
    assert graphs.sizes.tolist() == [base] * G and state.max_queries == m
    # Every key is stored up front: key i of graph g is part of it only once sizes[g] > i.
    where = (dict(keys=_dev(keys.reshape(-1, dim))) if layout == "dense"
             else dict(pages=(pool, table)))
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    for i in range(base, n):
        kc.batch_insert(graphs, state, **where, L=24, query_candidates=C, status=status)
        for g in range(G):
            cpu[g].insert(keys[g, i : i + 1])
    torch.cuda.synchronize()
    assert status.item() == 0
    assert graphs.sizes.tolist() == [n] * G
    adj = graphs.adjacency.cpu().numpy()
    knn = state.knn_ids.cpu().numpy()
    for g in range(G):
        want = cpu[g].adjacency(width=adj.shape[1]).view(np.int32)
        assert np.array_equal(adj[g * n : (g + 1) * n], want), f"graph {g}"
        ids, _ = cpu[g].query_knn()  # the GPU keeps a list in any order
        assert np.array_equal(np.sort(knn[g * m : (g + 1) * m], 1), np.sort(ids.view(np.int32), 1))
    rng = np.random.default_rng(3)
    q = rng.integers(-4, 5, size=(G * 4, dim)).astype(np.float32)
    r = kc.decode_search(graphs, _dev(q), **where, k=10, L=20)
    for i in range(q.shape[0]):
        want = cpu[i // 4].search(q[i], 10, L=20)
        assert np.array_equal(r.ids[i].cpu().numpy(), want.ids.astype(np.int32))


def test_batch_insert_skips_full_graphs_and_bad_keys():
    # A graph with no spare row, or whose new key is NaN, is left as it is (sizes, rows and
    # lists unchanged) and flags the status; the other graph of the launch is inserted.
    n, base = 300, 250
    keys, cpu, _, _ = insert_case(n, base)
    dim = keys.shape[2]
    graphs = kc.graph_set(cpu, capacity=base + 1).map(_dev)  # room for one key per graph
    state = kc.insert_state(cpu, capacity=base + 1).map(_dev)
    dense = np.zeros((2 * (base + 1), dim), dtype=np.float32)
    for g in range(2):
        dense[g * (base + 1) : (g + 1) * (base + 1)] = keys[g, : base + 1]
    dense[2 * base + 1] = np.nan  # graph 1's new key
    kd = _dev(dense)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    before = graphs.adjacency[base + 1 :].clone()
    kc.batch_insert(graphs, state, kd, status=status)
    torch.cuda.synchronize()
    assert graphs.sizes.tolist() == [base + 1, base]
    assert status.item() & (1 << 17) and not status.item() & (1 << 16)
    assert torch.equal(graphs.adjacency[base + 1 :], before)
    status.zero_()
    kc.batch_insert(graphs, state, kd, status=status)  # graph 0 is full now
    torch.cuda.synchronize()
    assert graphs.sizes.tolist() == [base + 1, base]
    assert status.item() & (1 << 16)


def test_batch_insert_refuses_bad_input():
    keys, cpu, pool, table = insert_case(300, 250)
    dim = keys.shape[2]
    graphs = kc.graph_set(cpu, capacity=300).map(_dev)
    state = kc.insert_state(cpu, capacity=300).map(_dev)
    kd = _dev(keys.reshape(-1, dim))
    with pytest.raises(ValueError, match="no sizes"):
        kc.batch_insert(graphs._replace(sizes=None), state, kd)
    with pytest.raises(ValueError, match="neither"):
        kc.batch_insert(graphs, state)
    with pytest.raises(ValueError, match="both"):
        kc.batch_insert(graphs, state, kd, pages=(pool, table))
    other = kc.insert_state(cpu, capacity=310).map(_dev)  # another capacity: other key rows
    with pytest.raises(ValueError, match="holders"):
        kc.batch_insert(graphs, other, kd)
    with pytest.raises(ValueError, match="keys"):
        kc.batch_insert(graphs, state, kd[:-1])
    with pytest.raises(ValueError, match="L"):
        kc.batch_insert(graphs, state, kd, L=0)
    with pytest.raises(ValueError, match="query_candidates"):
        kc.batch_insert(graphs, state, kd, query_candidates=5000)
    with pytest.raises(ValueError, match="sizes"):
        kc.batch_insert(graphs._replace(sizes=graphs.sizes[:1]), state, kd)
    with pytest.raises(ValueError, match="capacity"):
        kc.graph_set(cpu, capacity=100)
    with pytest.raises(ValueError, match="capacity"):
        kc.insert_state(cpu, capacity=100)
    with pytest.raises(ValueError, match="holder_capacity"):
        kc.insert_state(cpu, capacity=300, holder_capacity=0)
    plain = [kvsift.RoarGraphIndex(keys[0, :250], keys[1, :60], nq=10, M=6, L=32, threads=1)]
    with pytest.raises(ValueError, match="train"):
        kc.insert_state(plain, capacity=300)
    # A RoarGraphIndex with its build's training kNN passed in is accepted.
    lists = cpu[0].query_knn()  # over the same 250 keys
    with pytest.raises(ValueError, match="one query per kNN row"):
        kc.insert_state(plain, capacity=300, train=[(keys[1, :60], *lists)])
    st = kc.insert_state(plain, capacity=300, train=[(cpu[0].train_queries(), *lists)])
    assert st.max_queries == 121 and st.holders.shape == (300, 128)


def graphs_over_first_tokens(n, tokens, group, dim, seed):
    """Two KV heads of `tokens` paged f32 tokens, 2 * group queries, and one RoarGraph index per
    head over its first n tokens (trained on noisy copies of its group's queries)."""
    k, v, table, kd, vd = paged(tokens, 2, dim, 16, torch.float32, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(2 * group, dim, device="cuda", generator=g)
    idx = []
    for h in range(2):
        train = np.repeat(q[h * group : (h + 1) * group].cpu().numpy(), 40, 0)
        train = train + 0.3 * np.random.default_rng(h).standard_normal(train.shape).astype(np.float32)
        idx.append(kvsift.RoarGraphIndex(kd[h, :n].cpu().numpy(), train, nq=20, M=16, L=80,
                                         threads=1))
    return k, v, table, kd, vd, q, idx


def test_decode_step_honours_graph_sizes():
    # Graphs with spare rows (graph_set(capacity=)) hold only their first sizes[g] tokens: the
    # step (its window is the last tokens of sizes[g]) and the search must be those of the same
    # graphs stacked without spare rows, bit for bit, whatever the spare pages hold.
    n, cap, group, dim = 400, 480, 4, 64
    k, v, table, kd, vd, q, idx = graphs_over_first_tokens(n, cap, group, dim, 13)
    grown = kc.graph_set(idx, capacity=cap).map(_dev)
    plain = kc.graph_set(idx).map(_dev)
    for kw in (dict(k=50, L=100), dict(k=n - 68, L=n - 68)):
        o, lse = kc.decode_step(grown, q, k, v, table, sink=4, window=64, **kw)
        o2, lse2 = kc.decode_step(plain, q, k, v, table, sink=4, window=64, **kw)
        assert torch.equal(o, o2) and torch.equal(lse, lse2)
    r = kc.decode_search(grown, q, pages=(k, table), k=20, L=40)
    r2 = kc.decode_search(plain, q, pages=(k, table), k=20, L=40)
    assert torch.equal(r.ids, r2.ids) and torch.equal(r.scored, r2.scored)
    # The step passes max_hops on to its search: a tight cap retrieves other tokens.
    o_cap, _ = kc.decode_step(plain, q, k, v, table, sink=4, window=64, k=50, L=100, max_hops=2)
    o_free, _ = kc.decode_step(plain, q, k, v, table, sink=4, window=64, k=50, L=100)
    assert not torch.equal(o_cap, o_free)


def test_decode_step_attends_unindexed_tokens_with_the_window():
    # Graphs over the first n of the cache's tokens, decoded at n + u (u tokens generated since
    # the build, `unindexed`): with every middle token retrieved the step is full attention over
    # all n + u tokens; without `unindexed` it misses them.
    n, u, group, dim = 400, 30, 4, 64
    k, v, table, kd, vd, q, idx = graphs_over_first_tokens(n, n + u, group, dim, 15)
    graphs = kc.graph_set(idx).map(_dev)
    middle = n - 4 - 16
    o, lse = kc.decode_step(graphs, q, k, v, table, k=middle, L=middle, sink=4, window=16,
                            unindexed=u)
    for h in range(q.shape[0]):
        kh, vh = kd[h // group, : n + u].double(), vd[h // group, : n + u].double()
        logits = (kh @ q[h].double()) / math.sqrt(dim)
        assert abs(lse[h].item() - torch.logsumexp(logits, 0).item()) < 1e-4
        assert torch.allclose(o[h].double(), torch.softmax(logits, 0) @ vh, atol=1e-4, rtol=1e-4)
    o0, lse0 = kc.decode_step(graphs, q, k, v, table, k=middle, L=middle, sink=4, window=16)
    assert not torch.allclose(lse0, lse, atol=1e-3)
    with pytest.raises(Exception, match="unindexed"):
        kc.decode_step(graphs, q, k, v, table, unindexed=-1)


@pytest.mark.parametrize("key_dtype", [np.float32, np.float16])
def test_build_index_on_the_gpu_is_the_cpu_graph(key_dtype):
    # Integer data: every score and distance is exact, so the GPU's kNN and step-3 searches
    # find what the CPU's find and the graphs agree edge for edge.
    rng = np.random.default_rng(3)
    keys = rng.integers(-4, 5, size=(3000, 32)).astype(key_dtype)
    train = rng.integers(-4, 5, size=(400, 32)).astype(np.float32)
    params = dict(nq=50, M=16, L=100, threads=2)
    gpu = kc.build_index(keys, train, **params)
    cpu = kvsift.RoarGraphIndex(keys, train, **params)
    assert gpu.keys is keys
    assert np.array_equal(gpu.adjacency(), cpu.adjacency())
    assert np.array_equal(gpu.entry_points, cpu.entry_points)
    assert gpu.build_stats.total_seconds > 0 and gpu.build_stats.knn_seconds > 0
    q = rng.integers(-4, 5, size=(20, 32)).astype(np.float32)
    assert np.array_equal(gpu.search(q, 10, L=30).ids, cpu.search(q, 10, L=30).ids)


def test_build_indexes_equals_build_index_per_head():
    # Heads of different sizes (a head in the wrong place shows), integer data (exact scores):
    # sharded over 1, 2 or more builders than heads, every graph is build_index's of its head.
    rng = np.random.default_rng(5)
    keys = [rng.integers(-4, 5, size=(1200 + 150 * h, 32)).astype(np.float32) for h in range(3)]
    trains = [rng.integers(-4, 5, size=(300, 32)).astype(np.float32) for _ in range(3)]
    params = dict(nq=40, M=12, L=60, threads=2)
    single = [kc.build_index(k, t, **params) for k, t in zip(keys, trains)]
    for builders in (1, 2, 5):
        built = kc.build_indexes(keys, trains, builders=builders, **params)
        assert len(built) == 3
        for h in range(3):
            assert built[h].keys is keys[h]
            assert np.array_equal(built[h].adjacency(), single[h].adjacency()), (builders, h)
            assert np.array_equal(built[h].entry_points, single[h].entry_points)
            assert built[h].build_stats.knn_seconds > 0
    assert kc.build_indexes([], []) == []
    # Builders spread over devices (issue 20): the same graphs. Device 0 twice runs everywhere;
    # with two GPUs the builders alternate between them.
    ids = [0, 1] if torch.cuda.device_count() >= 2 else [0, 0]
    before = torch.cuda.current_device()
    built = kc.build_indexes(keys, trains, builders=3, devices=ids, **params)
    for h in range(3):
        assert np.array_equal(built[h].adjacency(), single[h].adjacency()), (ids, h)
    assert torch.cuda.current_device() == before


def test_build_indexes_refuses_bad_input():
    rng = np.random.default_rng(6)
    keys = [rng.standard_normal((300, 16)).astype(np.float32) for _ in range(2)]
    trains = [rng.standard_normal((60, 16)).astype(np.float32) for _ in range(2)]
    with pytest.raises(ValueError, match="as many training query sets as key sets"):
        kc.build_indexes(keys, trains[:1])
    with pytest.raises(ValueError, match="builders: expected >= 1, got 0"):
        kc.build_indexes(keys, trains, builders=0)
    with pytest.raises(ValueError, match="dtype of keys"):
        kc.build_indexes([keys[0], keys[1].astype(np.float16)], trains)
    with pytest.raises(ValueError, match="expected dimension 16"):
        kc.build_indexes(keys, [trains[0], trains[1][:, :8].copy()])
    with pytest.raises(ValueError, match="float32 or float16"):
        kc.build_indexes([keys[0].astype(np.float64)], trains[:1])
    count = torch.cuda.device_count()
    out_of_range = rf"devices\[1\]: expected a device id in \[0, {count}\), got {count}"
    with pytest.raises(ValueError, match=out_of_range):
        kc.build_indexes(keys, trains, devices=[0, count])
    with pytest.raises(ValueError, match=r"devices\[0\]: expected a device id in .* got -1"):
        kc.build_indexes(keys, trains, devices=[-1])
    with pytest.raises(ValueError, match=r"devices: expected at least one device id"):
        kc.build_indexes(keys, trains, devices=[])
    with pytest.raises(ValueError, match=r"builders: expected >= len\(devices\) = 3, got 2"):
        kc.build_indexes(keys, trains, builders=2, devices=[0, 0, 0])


def test_build_index_refuses_bad_input():
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((500, 16)).astype(np.float32)
    train = rng.standard_normal((100, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="dimension 16"):
        kc.build_index(keys, train[:, :8].copy())
    with pytest.raises(ValueError, match="float32 or float16"):
        kc.build_index(keys.astype(np.float64), train)
    with pytest.raises(ValueError, match="float32"):
        kc.build_index(keys, train.astype(np.float16))
    with pytest.raises(Exception, match="nq"):
        kc.build_index(keys, train, nq=1)
    with pytest.raises(Exception, match="contiguous"):
        kc.build_index(keys[:, ::2], train[:, ::2])
    bad = keys.copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        kc.build_index(bad, train)
    with pytest.raises(Exception, match="cuda|CUDA|device"):
        kc.build_index(torch.from_numpy(keys).cuda(), train)


def offloaded_layer(dtype, pairs=4, pages=32, page=16, dim=64, capacity=8, seed=3):
    """Full K/V per pair [pairs, tokens, dim] and an OffloadedKV over it (host pages in a
    shuffled order, through host_page), with its device tier poisoned with NaN."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(pairs, pages * page, dim, generator=g).to(dtype)
    v = torch.randn(pairs, pages * page, dim, generator=g).to(dtype)
    perm = torch.randperm(pairs * pages, generator=g)
    k_host = torch.empty(pairs * pages, page, dim, dtype=dtype).pin_memory()
    v_host = torch.empty_like(k_host).pin_memory()
    k_host[perm] = k.reshape(pairs * pages, page, dim)
    v_host[perm] = v.reshape(pairs * pages, page, dim)
    off = kc.OffloadedKV(k_host, v_host, pairs, capacity,
                         host_page=perm.view(pairs, pages).cuda(), buckets=8)
    off.k_device.fill_(float("nan"))
    off.v_device.fill_(float("nan"))
    return k.cuda(), v.cuda(), off


@pytest.mark.parametrize("dtype", DTYPES)
def test_offloaded_attention_pages_tokens_in_and_equals_attention_over_them(dtype):
    """Drifting retrievals over 12 steps: each step's output equals float64 attention over the
    same ids of the full K/V, so every page the step needed came in (the device tier starts as
    NaN) and the table followed the LRU; pages are reused, missed and evicted."""
    pairs, group, dim, page = 4, 2, 64, 16
    k, v, off = offloaded_layer(dtype, pairs=pairs, dim=dim, page=page)
    rng = np.random.default_rng(5)
    hot = [rng.choice(32, 4, replace=False) for _ in range(pairs)]  # 4 of 32 pages per pair
    q = torch.randn(pairs * group, dim, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    resident_changes = 0
    for step in range(12):
        if step % 3 == 0:  # a new working set; the old one ages out of the 8 slots
            hot = [rng.choice(32, 4, replace=False) for _ in range(pairs)]
        ids, indptr = [], [0]
        for h in range(pairs * group):
            pages_h = hot[h // group]
            toks = rng.choice(pages_h, 6) * page + rng.integers(0, page, 6)
            ids.extend(int(t) for t in toks)
            indptr.append(len(ids))
        before = off.slot_of.clone()
        o, lse = off.attend(q, torch.tensor(indptr, device="cuda"),
                            torch.tensor(ids, dtype=torch.int32, device="cuda"), scale=0.125,
                            status=status)
        resident_changes += int((off.slot_of != before).sum())
        for h in range(pairs * group):
            t = torch.tensor(ids[indptr[h]:indptr[h + 1]], device="cuda")
            kk, vv = k[h // group, t].double(), v[h // group, t].double()
            logits = 0.125 * (kk @ q[h].double())
            want = torch.softmax(logits, 0) @ vv
            assert torch.allclose(o[h].double(), want, atol=TOL[dtype], rtol=TOL[dtype])
            assert lse[h].item() == pytest.approx(torch.logsumexp(logits, 0).item(), abs=1e-4)
    assert status.item() == 0 and resident_changes > 20
    # The table is the LRU's: resident -> pair * capacity + slot, else the guard page.
    pairs_i = torch.arange(pairs, device="cuda")[:, None]
    want_table = torch.where(off.slot_of >= 0, pairs_i * 8 + off.slot_of, pairs * 8)
    assert torch.equal(off.page_table, want_table.int())


def test_offloaded_attention_honours_buffer_elasticity_limits():
    """Two requests x 2 KV heads share 40 device pages through ks.BufferElasticity (each pair
    has 16 slots): request 0's demand grows, its limits rise and request 1's fall, and every
    pair holds at most its limit after each step (the excess evicted), the outputs stay exact,
    and a limit above the capacity is refused with bit 16."""
    pairs, group, dim, page, cap = 4, 2, 64, 16, 16
    k, v, off = offloaded_layer(torch.float32, pairs=pairs, dim=dim, page=page, capacity=cap)
    el = kvsift.BufferElasticity(40)
    assert el.admit(0, 3000, 0, 8) and el.admit(1, 1000, 0, 8)
    rng = np.random.default_rng(8)
    q = torch.randn(pairs * group, dim, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    shrunk = 0
    for step in range(10):
        want = [5 if (p < 2 and 3 <= step < 7) else 3 for p in range(pairs)]  # distinct pages
        chosen = [rng.choice(32, want[p], replace=False) for p in range(pairs)]
        ids, indptr = [], [0]
        for h in range(pairs * group):
            toks = chosen[h // group] * page + rng.integers(0, page, want[h // group])
            ids.extend(int(t) for t in toks)
            indptr.append(len(ids))
        mandatory = [len(set(c.tolist())) for c in chosen]
        for r in range(2):
            el.set_mandatory(r, 3000 if r == 0 else 1000, mandatory[2 * r] + mandatory[2 * r + 1])
        limits = el.pair_limits([0, 1], mandatory)
        assert int(limits.sum()) <= 40
        held_before = (off.slot_of >= 0).sum(1).cpu().numpy()
        o, _ = off.attend(q, torch.tensor(indptr, device="cuda"),
                          torch.tensor(ids, dtype=torch.int32, device="cuda"), scale=0.125,
                          status=status, limits=torch.from_numpy(limits).cuda())
        held = (off.slot_of >= 0).sum(1).cpu().numpy()
        assert (held <= limits).all(), (held, limits)
        shrunk += int((held_before > limits).sum())
        for h in range(pairs * group):
            t = torch.tensor(ids[indptr[h]:indptr[h + 1]], device="cuda")
            kk, vv = k[h // group, t].double(), v[h // group, t].double()
            want_o = torch.softmax(0.125 * (kk @ q[h].double()), 0) @ vv
            assert torch.allclose(o[h].double(), want_o, atol=1e-5)
    assert status.item() == 0 and shrunk > 0
    over = torch.tensor([cap + 1, 1, 1, 1], dtype=torch.int32, device="cuda")
    before = off.slot_of.clone()
    off.attend(q, torch.tensor(indptr, device="cuda"),
               torch.tensor(ids, dtype=torch.int32, device="cuda"), status=status, limits=over)
    assert status.item() & 16 and torch.equal(off.slot_of[0], before[0])
    with pytest.raises(ValueError, match=r"limits: expected shape \(4,\)"):
        off.attend(q, torch.tensor(indptr, device="cuda"),
                   torch.tensor(ids, dtype=torch.int32, device="cuda"), limits=over[:3])


def test_offloaded_attention_reports_and_refuses_bad_input():
    k, v, off = offloaded_layer(torch.float16)
    q = torch.randn(8, 64, device="cuda")
    indptr = torch.arange(9, device="cuda", dtype=torch.int64)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    bad_ids = torch.full((8,), 32 * 16 + 1, dtype=torch.int32, device="cuda")  # past the pages
    off.attend(q, indptr, bad_ids, status=status)
    assert status.item() == 1 and int((off.slot_of >= 0).sum()) == 0
    ids = torch.zeros(8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"max_ids: expected 0 <= max_ids <= 8"):
        off.attend(q, indptr, ids, max_ids=9)
    with pytest.raises(ValueError, match=r"q: expected \[qo_heads, 64\]"):
        off.attend(q[:, :32].contiguous(), indptr, ids)
    with pytest.raises(ValueError, match=r"indptr: expected shape \(9,\)"):
        off.attend(q, indptr[:5], ids)
    with pytest.raises(ValueError, match=r"expected a multiple|positive multiple of the pairs"):
        off.attend(q[:7], indptr[:8], ids)
    pageable = torch.empty(64, 16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"expected pinned \(page-locked\) host memory"):
        kc.OffloadedKV(pageable, pageable, 4, 8)
    pinned = pageable.pin_memory()
    with pytest.raises(ValueError, match=r"must have k_host's dtype"):
        kc.OffloadedKV(pinned, pinned.float().pin_memory(), 4, 8)
    with pytest.raises(ValueError, match=r"capacity: expected an integer in \[1, 8192\]"):
        kc.OffloadedKV(pinned, pinned, 4, 0)
    small = torch.empty(64, 16, 32, dtype=torch.float16).pin_memory()
    narrow = kc.OffloadedKV(small, small, 4, 8)
    with pytest.raises(ValueError, match=r"head_dim must be 64, 128 or 256, got 32"):
        narrow.attend(q[:, :32].contiguous(), indptr, ids)
    assert int((narrow.slot_of >= 0).sum()) == 0  # refused before anything ran


def test_decode_step_bench_against_sdpa_runs_and_reports(tmp_path):
    # bench/python/cuda_decode_step.py at a tiny size: the step and torch SDPA over one cache.
    # At this size the search is near exact (recall), the step's output is exact attention over
    # the tokens it attends, and every round carries both times.
    import json

    from bench_scripts import run_bench

    out = tmp_path / "r.json"
    run_bench("cuda_decode_step.py", "--requests", "1", "--n", "4096", "--window", "64", "--k",
              "20", "--L", "128", "--expand-width", "4", "--max-hops", "0", "--rounds", "2",
              "--reps", "2", "--json", str(out))
    res = json.loads(out.read_text())
    assert res["recall_at_k"] > 0.9
    assert res["max_abs_error_vs_own_tokens"] < 1e-2
    assert 0 < res["softmax_mass_attended"] <= 1 + 1e-6
    assert len(res["rounds"]) == 2
    for x in res["rounds"]:
        assert x["step_us"] > 0 and x["sdpa_us"] > 0
        assert x["speedup"] == pytest.approx(x["sdpa_us"] / x["step_us"])


def routing_case(graphs=3, dim=16, seed=8):
    """Per-graph RouteSets of different rows and list lengths over integer keys, from training
    queries of +-1/4 entries (unit norm at dim 16, so the routing vectors are exact in f32, f16
    and bf16 and every score against an integer query is exact: the GPU ranks as the CPU)."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(-4, 5, size=(graphs, 300, dim)).astype(np.float32)
    sets = []
    for h in range(graphs):
        train = np.where(rng.random((200, dim)) < 0.5, -0.25, 0.25).astype(np.float32)
        sets.append(kvsift.make_route_set(train, keys[h], 50 + 20 * h, list_len=6 - h))
    q = rng.integers(-4, 5, size=(graphs * 8, dim)).astype(np.float32)
    return keys, sets, q


def to_device(st, dtype=torch.float32):
    """A RouteStack's arrays on the GPU, the vectors and centroids as `dtype`."""
    return st.map(lambda a: torch.from_numpy(a).cuda().to(dtype) if a.dtype == np.float32
                  else torch.from_numpy(a).cuda())


def cpu_routes(sets, q, per_graph, top, probe=0):
    """RouteSet.seeds per query (graph i // per_graph), each route's list padded with -1 to the
    longest list_len: the layout kvsift.cuda.route_seeds writes."""
    width = max(s.list_len for s in sets)
    out = np.full((q.shape[0], top, width), -1, dtype=np.int64)
    for i in range(q.shape[0]):
        s = sets[i // per_graph]
        got = s.seeds(q[i], top=top, probe=probe).astype(np.int64).reshape(top, s.list_len)
        out[i, :, : s.list_len] = np.where(got == kvsift.INVALID_ID, -1, got)
    return out.reshape(q.shape[0], top * width)


@pytest.mark.parametrize("dtype", DTYPES)
def test_route_seeds_equal_the_cpu_routes(dtype):
    """kvsift.cuda.route_seeds over a route_stack equals RouteSet.seeds query by query: graphs
    of different rows and list lengths (the shorter lists padded with -1), GQA groups of 4, a
    query of NaN (no seeds), the graph of each query given or in GQA order."""
    _, sets, q = routing_case()
    q[5, 3] = np.nan
    st = to_device(kvsift.cuda.route_stack(sets), dtype)
    qd = torch.from_numpy(q).cuda()
    for top in (1, 4):
        want = cpu_routes(sets, q, 8, top)
        status = torch.zeros(1, dtype=torch.int32, device="cuda")
        got = kc.route_seeds(st, qd, top=top, group=4, status=status)
        assert got.dtype == torch.int32 and got.shape == (24, top * 6)
        np.testing.assert_array_equal(got.cpu().numpy(), want)
        assert status.item() == 0
        assert np.all(want[5] == -1) and np.any(want[4] != -1)
    graph = torch.arange(24, dtype=torch.int32, device="cuda") // 8
    np.testing.assert_array_equal(kc.route_seeds(st, qd, top=3, graph=graph).cpu().numpy(),
                                  cpu_routes(sets, q, 8, 3))


def test_route_seeds_probe_the_clusters_as_the_cpu():
    """Clustered sets: the rows of each query's best `probe` clusters compete, as
    RouteSet.seeds(probe=) (f32; the centroids are means, exact to float rounding only, and
    the data has no near-ties at the cut); probing every cluster is the flat routing, probing
    one is not."""
    _, sets, q = routing_case(seed=9)
    for s in sets:
        s.cluster(6)
    st = to_device(kvsift.cuda.route_stack(sets))
    assert st.max_clusters == 6
    qd = torch.from_numpy(q).cuda()
    for probe in (1, 2, 6):
        got = kc.route_seeds(st, qd, top=4, group=4, probe=probe).cpu().numpy()
        np.testing.assert_array_equal(got, cpu_routes(sets, q, 8, 4, probe))
    flat = cpu_routes(sets, q, 8, 4)
    np.testing.assert_array_equal(cpu_routes(sets, q, 8, 4, 6), flat)
    assert not np.array_equal(cpu_routes(sets, q, 8, 4, 1), flat)


def test_routed_seeds_warm_start_decode_search_as_on_the_cpu():
    """Route on the GPU, search from the routes with an expand limit: with expand_width 1 the
    CPU's search entered at RouteSet.seeds (padding skipped), id for id."""
    idx, graphs, keys, q, pool, table = search_case(dim=16, seed=6)
    rng = np.random.default_rng(3)
    sets = []
    for h in range(len(idx)):
        train = np.where(rng.random((120, 16)) < 0.5, -0.25, 0.25).astype(np.float32)
        sets.append(kvsift.make_route_set(train, keys[h], 30, list_len=8))
    group = q.shape[0] // len(idx)
    qd = torch.from_numpy(q).cuda()
    seeds = kc.route_seeds(to_device(kvsift.cuda.route_stack(sets)), qd, top=3, group=group)
    r = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, seeds=seeds,
                         expand_limit=8)
    cold = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, expand_limit=8)
    for i in range(q.shape[0]):
        own = sets[i // group].seeds(q[i], top=3)
        cpu = idx[i // group].search(q[i], 10, L=20, entries=own, expand_limit=8)
        np.testing.assert_array_equal(r.ids[i].cpu().numpy(), cpu.ids.astype(np.int32))
        assert r.scored[i].item() == int(cpu.distance_computations[0])
    assert not torch.equal(r.scored, cold.scored)  # the routes changed the walks


def test_decode_step_routes_seed_its_search_as_route_seeds_then_decode_search():
    """decode_step(routes=...) routes every query head and searches from the routes after the
    carry: with a carry of -1 (no seeds; it comes back holding the retrieved ids) the ids equal
    decode_search's from route_seeds' seeds over the step's range, and differ from the cold
    step's at the same expand limit; flat and clustered stacks, f32 and f16 routing vectors,
    the routing group given or the default. Routes with a carry of ids keep both seed sets."""
    idx, graphs, keys, q, pool, table = search_case(dim=64, seed=6)  # (attention: d 64+)
    heads, n = q.shape[0], keys.shape[1]
    group = heads // len(idx)
    rng = np.random.default_rng(4)
    sets = []
    for h in range(len(idx)):
        train = np.repeat(q[h * group : (h + 1) * group], 10, 0)
        train = train + rng.integers(-2, 3, size=train.shape).astype(np.float32)
        train /= np.linalg.norm(train, axis=1, keepdims=True)
        sets.append(kvsift.make_route_set(train, keys[h], 40, list_len=10))
    qd = torch.from_numpy(q).cuda()
    args = dict(k=10, L=20, sink=4, window=64, walk_through=False, expand_limit=2)
    first = torch.full((heads,), 4, dtype=torch.int32, device="cuda")
    last = torch.full((heads,), n - 64, dtype=torch.int32, device="cuda")
    cold = torch.full((heads, 10), -1, dtype=torch.int32, device="cuda")
    kc.decode_step(graphs, qd, pool, pool, table, carry=cold, **args)
    for clustered, dtype, route_group, probe in ((False, torch.float32, None, 0),
                                                 (False, torch.float16, 2, 0),
                                                 (True, torch.float32, 4, 2)):
        if clustered:
            for s in sets:
                s.cluster(4)
        st = to_device(kvsift.cuda.route_stack(sets), dtype)
        carry = torch.full((heads, 10), -1, dtype=torch.int32, device="cuda")
        status = torch.zeros(1, dtype=torch.int32, device="cuda")
        o, lse = kc.decode_step(graphs, qd, pool, pool, table, carry=carry, routes=st,
                                route_top=3, route_group=route_group, route_probe=probe,
                                status=status, **args)
        assert status.item() == 0 and bool(torch.isfinite(lse).all())
        seeds = kc.route_seeds(st, qd, top=3, group=4, probe=probe)
        r = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, seeds=seeds,
                             expand_limit=2, walk_through=False, id_range=(first, last))
        assert torch.equal(torch.sort(carry, 1).values, torch.sort(r.ids, 1).values)
        assert not torch.equal(torch.sort(carry, 1).values, torch.sort(cold, 1).values)
    # A carry of ids and routes: the carry's seeds come first, the routes' after.
    both = cold.clone()
    kc.decode_step(graphs, qd, pool, pool, table, carry=both, routes=st, route_top=3,
                   route_probe=2, **args)
    joined = torch.cat([cold, seeds], 1)
    r = kc.decode_search(graphs, qd, pages=(pool, table), k=10, L=20, seeds=joined,
                         expand_limit=2, walk_through=False, id_range=(first, last))
    assert torch.equal(torch.sort(both, 1).values, torch.sort(r.ids, 1).values)
    # Bad routes are refused before anything runs.
    with pytest.raises(ValueError, match="expected a RouteStack"):
        kc.decode_step(graphs, qd, pool, pool, table, routes=tuple(st)[:5], **args)
    with pytest.raises(ValueError, match="routing group dividing the GQA group"):
        kc.decode_step(graphs, qd, pool, pool, table, routes=st, route_group=3, **args)
    with pytest.raises(ValueError, match="top"):
        kc.decode_step(graphs, qd, pool, pool, table, routes=st, route_top=0, **args)
    with pytest.raises(ValueError, match="expected a tensor in CUDA device memory"):
        kc.decode_step(graphs, qd, pool, pool, table, routes=kvsift.cuda.route_stack(sets), **args)


def test_route_seeds_report_and_refuse_bad_input():
    _, sets, q = routing_case()
    st = to_device(kvsift.cuda.route_stack(sets))
    qd = torch.from_numpy(q).cuda()
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    graph = torch.full((24,), 7, dtype=torch.int32, device="cuda")  # no graph 7
    got = kc.route_seeds(st, qd, top=2, graph=graph, status=status)
    assert status.item() & 1 and bool(torch.all(got == -1))
    with pytest.raises(ValueError, match="probe 2 needs a clustered RouteStack"):
        kc.route_seeds(st, qd, probe=2)
    with pytest.raises(ValueError, match="expected a RouteStack"):
        kc.route_seeds(tuple(st)[:5], qd)
    with pytest.raises(ValueError, match=r"q: expected \[queries, 16\]"):
        kc.route_seeds(st, qd[:, :8].contiguous())
    with pytest.raises(ValueError, match="q: expected float32"):
        kc.route_seeds(st, qd.half())
    with pytest.raises(ValueError, match="top"):
        kc.route_seeds(st, qd, top=0)
    with pytest.raises(ValueError, match="group"):
        kc.route_seeds(st, qd, group=9)
    with pytest.raises(ValueError, match="not a multiple of the graphs"):
        kc.route_seeds(st, qd[:23])
    with pytest.raises(ValueError, match="expected a tensor in CUDA device memory"):
        kc.route_seeds(kvsift.cuda.route_stack(sets), qd)
    with pytest.raises(ValueError, match="lists: expected int32 or uint32"):
        kc.route_seeds(st._replace(lists=st.lists.float()), qd)
