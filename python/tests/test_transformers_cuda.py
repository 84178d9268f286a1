"""kvsift.transformers on a CUDA device: a tiny randomly initialised Llama (2 layers, 4 query heads,
2 KV heads, head dim 64, a 300-token prompt) moved to the GPU. With every middle token retrieved
the decode equals eager attention on the same device (top-k and DIPR); one layer's step equals
attention over the window and the ids the GPU search returned, computed by hand in float64, with
DIPR seeded by the window's best score; bf16 runs. Skipped without torch, transformers, a CUDA
device or the package's CUDA layer (KVSIFT_PY_CUDA=ON)."""

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
kc = pytest.importorskip("kvsift.cuda", reason="kvsift built without its CUDA layer")

import kvsift as ks  # noqa: E402
import kvsift.transformers as kt  # noqa: E402
from hf_generate import generate, max_logit_gap  # noqa: E402

PROMPT, NEW, SINK, WINDOW = 300, 8, 4, 32
MIDDLE = PROMPT - SINK - WINDOW


def tiny_config(dim=64):
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=dim,
        max_position_embeddings=1024,
    )


def pair(dtype=torch.float32):
    """(eager model, kvsift model) with the same weights, on the GPU."""
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(tiny_config()).eval()
    eager.set_attn_implementation("eager")
    model = transformers.LlamaForCausalLM(tiny_config()).eval()
    model.load_state_dict(eager.state_dict())
    model.set_attn_implementation(kt.NAME)
    return eager.to("cuda", dtype), model.to("cuda", dtype)


@pytest.fixture(scope="module")
def models():
    eager, model = pair()
    ids = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1)).cuda()
    return model, ids, generate(eager, ids, None)


def test_gpu_retrieval_of_every_middle_token_equals_eager(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=SINK, window=WINDOW, k=PROMPT)  # clamps to 264
    out = generate(model, ids, cache)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_gap(out, ref) < 1e-4
    # The GPU path ran: one graph set per layer on the device, a graph per KV head over every
    # prompt token (ids = positions), and each step retrieved every middle token of every head.
    for state in cache.kvsift_layers.values():
        assert state.gpu is not None and state.gpu.adjacency.is_cuda
        assert state.gpu.row_offset.tolist() == [0, PROMPT, 2 * PROMPT]
    assert cache.retrieved == (NEW - 1) * 2 * 4 * MIDDLE


def test_gpu_dipr_covering_every_score_equals_eager(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(
        model.config, sink=SINK, window=WINDOW, mode="dipr", beta=1e6, l0=PROMPT,
        max_candidates=PROMPT,
    )
    out = generate(model, ids, cache)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_gap(out, ref) < 1e-4
    assert cache.retrieved == (NEW - 1) * 2 * 4 * MIDDLE


def test_gpu_wide_expansion_and_degree_cap_still_exact_with_every_token(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=SINK, window=WINDOW, k=PROMPT, expand_width=8)
    out = generate(model, ids, cache, new=4)
    assert max_logit_gap(out, ref) < 1e-4


def test_gpu_small_k_differs_from_eager_but_runs(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=2, window=8, k=4, L=16)
    out = generate(model, ids, cache)
    assert all(torch.isfinite(x).all() for x in out.logits)
    torch.testing.assert_close(out.logits[0], ref.logits[0], rtol=1e-4, atol=1e-4)  # prefill
    assert max_logit_gap(out, ref) > 1e-3
    assert cache.retrieved == (NEW - 1) * 2 * 4 * 4


def by_hand(q, key, value, toks, g, scale):
    """Attention of one head's query over tokens `toks` of KV head g, float64 on the CPU."""
    k_sel = key[0, g, toks].double().cpu()
    logits = scale * (k_sel @ q.double().cpu())
    return torch.softmax(logits, 0) @ value[0, g, toks].double().cpu()


def spy_steps(monkeypatch):
    """Records every kvsift.cuda.decode_step call: (kwargs, the carry as it went in, the carry
    as it came out)."""
    seen, step = [], kc.decode_step

    def spy(*a, **kw):
        before = kw["carry"].clone()
        out = step(*a, **kw)
        seen.append((kw, before, kw["carry"].clone()))
        return out

    monkeypatch.setattr(kc, "decode_step", spy)
    return seen


@pytest.mark.parametrize("mode", ["topk", "dipr"])
def test_gpu_step_equals_window_plus_returned_ids_by_hand(models, monkeypatch, mode):
    """One layer's step against its definition: the ids the step retrieved (its carry, read
    back through a spy) plus the window [0, sink) + [prompt - window, n), the generated token
    included. DIPR: seeded with each head's best window score (heads 0 and 2 point at a window
    key so the seed leads), every retrieved token within beta of the best token of the whole
    context."""
    model, ids, _ = models
    cache = kt.KvsiftCache(
        model.config, sink=3, window=5, k=7, L=32, mode=mode, beta=0.075, l0=16
    )
    generate(model, ids, cache, new=2)
    seen = spy_steps(monkeypatch)
    layer = model.model.layers[1].self_attn
    key, value = cache.layers[1].keys, cache.layers[1].values  # (1, 2, 301, 64)
    q = torch.randn(1, 4, 1, 64, device="cuda") * 3
    if mode == "dipr":
        q[0, 0, 0], q[0, 2, 0] = 3 * key[0, 0, PROMPT - 2], 3 * key[0, 1, PROMPT - 2]
    kt._active_cache.set(cache)
    out, _ = kt.kvsift_attention(layer, q, key, value, None, scaling=0.25)
    ((kw, carry_in, carry),) = seen
    n, lo, hi = key.shape[2], 3, PROMPT - 5
    assert n == PROMPT + 1
    assert kw["sink"] == lo and kw["window"] == 5 and kw["unindexed"] == 1
    assert (carry_in == -1).all()  # no warm start: a cold search
    window = torch.cat([torch.arange(0, lo), torch.arange(hi, n)])
    for h in range(4):
        g = h // 2
        qh = q[0, h, 0]
        row = carry[h].long().cpu()
        mid = row[row >= 0]
        assert ((mid >= lo) & (mid < hi)).all()
        if mode == "dipr":
            assert kw["beta"] == pytest.approx(0.075 / 0.25) and kw["seed_from_window"]
            raw = key[0, g].double().cpu() @ qh.double().cpu()
            best = raw[torch.cat([window, mid])].max().item()
            assert (raw[mid] >= best - 0.075 / 0.25 - 1e-4).all()
        else:
            assert len(mid) == 7
        want = by_hand(qh, key, value, torch.cat([window, mid]), g, 0.25)
        torch.testing.assert_close(out[0, 0, h].double().cpu(), want, rtol=1e-5, atol=1e-5)


def test_gpu_warm_start_walk_through_and_max_hops_reach_the_step(models, monkeypatch):
    """warm_start=E on CUDA: a layer's first decode step searches cold (its carry all -1, no
    expand limit), every later one from the ids its previous step retrieved with expand_limit
    min(E, L); walk_through and max_hops are passed on; without warm_start every step is cold."""
    model, ids, _ = models
    seen = spy_steps(monkeypatch)
    cache = kt.KvsiftCache(
        model.config, sink=3, window=5, k=7, L=32, warm_start=5, walk_through=False, max_hops=40
    )
    generate(model, ids, cache, new=4)
    assert len(seen) == 2 * 3  # 2 layers x 3 decode steps
    for layer in range(2):
        mine = seen[layer::2]
        assert (mine[0][1] == -1).all() and mine[0][0]["expand_limit"] == 0
        for (_, _, after), (kw, before, _) in zip(mine, mine[1:]):
            assert torch.equal(before, after) and kw["expand_limit"] == 5
        assert all(kw["walk_through"] is False and kw["max_hops"] == 40 for kw, _, _ in mine)
        assert [kw["unindexed"] for kw, _, _ in mine] == [1, 2, 3]
    assert torch.equal(cache.kvsift_layers[1].previous, seen[-1][2])
    seen.clear()
    generate(model, ids, kt.KvsiftCache(model.config, sink=3, window=5, k=7, L=32), new=3)
    assert all((before == -1).all() and kw["expand_limit"] == 0 for kw, before, _ in seen)


def test_gpu_retrieved_counts_the_steps_middle_tokens(models):
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=3, window=5, k=7, L=32)
    generate(model, ids, cache, new=3)
    assert cache.retrieved == 2 * 2 * 4 * 7  # 2 decode steps x 2 layers x 4 heads x k


def test_gpu_bf16_model_runs_close_to_eager():
    eager, model = pair(torch.bfloat16)
    ids = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1)).cuda()
    ref = generate(eager, ids, None, new=4)
    cache = kt.KvsiftCache(model.config, sink=SINK, window=WINDOW, k=PROMPT)
    out = generate(model, ids, cache, new=4)
    assert cache.kvsift_layers[0].gpu is not None
    scale = max(x.abs().max().item() for x in ref.logits)
    assert max_logit_gap(out, ref) < 0.05 * scale  # bf16 rounding of SDPA against eager


def test_gpu_generated_window_is_refused_before_anything_is_cached(models):
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=SINK, window=WINDOW, generated_window=4)
    with pytest.raises(ks.InvalidArgument, match="generated_window .* runs on the CPU only"):
        generate(model, ids, cache)
    assert cache.get_seq_length() == 0 and not cache.kvsift_layers


def test_gpu_auto_mode_is_refused_before_anything_is_cached(models):
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=SINK, window=WINDOW, mode="auto")
    with pytest.raises(ks.InvalidArgument, match="mode='auto' .* runs on the CPU only"):
        generate(model, ids, cache)
    assert cache.get_seq_length() == 0 and not cache.kvsift_layers


@pytest.mark.parametrize("warm_start", [0, 8])
def test_gpu_step_does_not_synchronise(models, warm_start):
    """The decode path stays asynchronous: a step's layer runs under
    torch.cuda.set_sync_debug_mode("error"), which raises on any host synchronisation (warm
    starts keep the last step's ids on the device)."""
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=SINK, window=WINDOW, k=16, warm_start=warm_start)
    generate(model, ids, cache, new=2)
    layer = model.model.layers[0].self_attn
    key, value = cache.layers[0].keys, cache.layers[0].values
    q = torch.randn(1, 4, 1, 64, device="cuda")
    kt._active_cache.set(cache)
    kt.kvsift_attention(layer, q, key, value, None, scaling=0.125)  # builds the step's inputs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _ = kt.kvsift_attention(layer, q, key, value, None, scaling=0.125)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(out.float().abs().max().item())
