"""kvsift.transformers on a tiny randomly initialised Llama (2 layers, 4 query heads, 2 KV heads,
head dim 16, a 300-token prompt), on the CPU: with every middle token retrieved, decoding equals
eager attention (same tokens, logits to 1e-5); with a small k it differs but runs; bad
parameters and misuse raise errors naming the fix. Skipped where torch/transformers are not
installed (.ci/install-deps.sh installs them for CI)."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvsift as ks  # noqa: E402
import kvsift.transformers as kt  # noqa: E402
from hf_generate import generate, max_logit_gap  # noqa: E402

PROMPT, NEW = 300, 8


def tiny_config():
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
    )


def eager_and_kvsift(model_class, config):
    """The same randomly initialised model twice (torch seed 0): with eager attention, and with
    kvsift's attention registered. Each gets its own config() (set_attn_implementation writes
    into it, and a shared one would switch both)."""
    torch.manual_seed(0)
    eager = model_class(config()).eval()
    eager.set_attn_implementation("eager")
    model = model_class(config()).eval()
    model.load_state_dict(eager.state_dict())
    model.set_attn_implementation(kt.NAME)
    return eager, model


@pytest.fixture(scope="module")
def models():
    eager, model = eager_and_kvsift(transformers.LlamaForCausalLM, tiny_config)
    ids = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = eager.generate(
            ids,
            max_new_tokens=NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return model, ids, ref


def test_retrieving_every_middle_token_equals_eager(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=4, window=32, k=PROMPT)  # k clamps to 264
    out = generate(model, ids, cache)
    assert torch.equal(out.sequences, ref.sequences)
    for got, want in zip(out.logits, ref.logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The decode steps went through the indexes: one graph per layer and KV head, over exactly
    # the middle tokens of the prompt (first 4 and last 32 stay in the window).
    assert sorted(cache.kvsift_layers) == [0, 1]
    for state in cache.kvsift_layers.values():
        assert state.prompt == PROMPT and len(state.graphs) == 2
        assert all(g.size == PROMPT - 4 - 32 for g in state.graphs)
    assert cache.get_seq_length() == PROMPT + NEW - 1


def test_generated_tokens_inserted_into_the_indexes_keep_decode_exact(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=4, window=32, k=PROMPT + NEW, generated_window=2)
    out = generate(model, ids, cache)
    assert torch.equal(out.sequences, ref.sequences)
    for got, want in zip(out.logits, ref.logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # After the last step the cache holds PROMPT + NEW - 1 tokens: all generated ones but the
    # last 2 left the window for the graphs, and retrieval found them there (exact logits).
    inserted = NEW - 1 - 2
    for state in cache.kvsift_layers.values():
        assert state.inserted == inserted
        assert all(isinstance(g, ks.InsertableGraphIndex) for g in state.graphs)
        assert all(g.size == PROMPT - 4 - 32 + inserted for g in state.graphs)


def test_inserted_generated_tokens_are_retrieved_with_a_small_k(models):
    model, ids, ref = models
    # No prompt window: the exact part is the sink and the newest generated token only.
    cache = kt.KvsiftCache(model.config, sink=2, window=0, k=8, L=32, generated_window=1)
    out = generate(model, ids, cache, new=12)
    assert all(torch.isfinite(x).all() for x in out.logits)
    for state in cache.kvsift_layers.values():
        assert state.inserted == 12 - 1 - 1
    # 11 decode steps x 2 layers x 4 query heads x 8 retrieved tokens.
    assert cache.retrieved == 11 * 2 * 4 * 8


def test_add_queries_makes_every_nth_steps_queries_training_queries(models):
    model, ids, ref = models
    runs = {}
    for every in (0, 3):
        cache = kt.KvsiftCache(model.config, sink=2, window=0, k=8, L=32, generated_window=1,
                               add_queries=every)
        out = generate(model, ids, cache, new=12)
        assert all(torch.isfinite(x).all() for x in out.logits)
        runs[every] = cache
    for layer, state in runs[3].kvsift_layers.items():
        base = runs[0].kvsift_layers[layer]
        group = 4 // len(state.graphs)  # query heads per KV head
        for graph, plain in zip(state.graphs, base.graphs):
            m = plain.train_queries().shape[0]  # the build's (the same build in both runs)
            # 11 decode steps; steps 0, 3, 6, 9 added their queries.
            assert graph.train_queries().shape[0] == m + 4 * group
            lists, _ = graph.query_knn()
            added = lists[m:]
            valid = added != ks.INVALID_ID
            assert valid.sum(axis=1).min() >= 1 and (added[valid] < graph.size).all()
        assert state.steps == 11
        # Each KV head got its own query heads' queries (group g = heads g*group .. ).
        m = base.graphs[0].train_queries().shape[0]
        assert not np.array_equal(
            state.graphs[0].train_queries()[m:], state.graphs[1].train_queries()[m:]
        )


def test_no_sink_and_a_window_of_generated_tokens_only_still_exact(models):
    model, ids, ref = models
    out = generate(model, ids, kt.KvsiftCache(model.config, sink=0, window=0, k=PROMPT))
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_gap(out, ref) < 1e-5


def test_small_k_differs_from_eager_but_runs(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=2, window=8, k=4, L=16)
    out = generate(model, ids, cache)
    assert out.sequences.shape == ref.sequences.shape
    assert all(torch.isfinite(x).all() for x in out.logits)
    # The prefill is SDPA (the first token's logits are eager's); the decode steps attend 4 of
    # 290 middle tokens, an approximation visibly not eager attention.
    torch.testing.assert_close(out.logits[0], ref.logits[0], rtol=1e-5, atol=1e-5)
    assert max_logit_gap(out, ref) > 1e-3


def attention_by_hand(q, keys, values, scale):
    """Softmax attention of one query over (tokens, d) keys and values, in float64."""
    logits = scale * (keys.astype(np.float64) @ q)
    w = np.exp(logits - logits.max())
    return (w / w.sum()) @ values


def test_decode_step_equals_the_module_calls_by_hand(models):
    """One decode step of one layer against kvsift's per-head calls written out: window
    [0, sink) + [n0 - window, n) dense, the middle through each KV head's graph."""
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=3, window=5, k=7, L=32)
    generate(model, ids, cache, new=2)
    layer = model.model.layers[1].self_attn
    key, value = cache.layers[1].keys, cache.layers[1].values  # (1, 2, 301, 16)
    q = torch.randn(1, 4, 1, 16)
    kt._active_cache.set(cache)
    out, _ = kt.kvsift_attention(layer, q, key, value, None, scaling=0.25)
    n, lo, hi = key.shape[2], 3, PROMPT - 5
    for h in range(4):
        g = h // 2
        graph = cache.kvsift_layers[1].graphs[g]
        qh = q[0, h, 0].numpy()
        mid = graph.search(qh, 7, L=32).ids
        toks = np.concatenate([np.arange(0, lo), lo + mid, np.arange(hi, n)])
        want = attention_by_hand(qh, key[0, g, toks].numpy(), value[0, g, toks].numpy(), 0.25)
        np.testing.assert_allclose(out[0, 0, h].numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, r"k must be >= 1, got 0"),
        ({"k": -3}, r"k must be >= 1, got -3"),
        ({"window": -1}, r"window must be >= 0, got -1"),
        ({"sink": 2.5}, r"sink must be an int, got float"),
        ({"k": 50, "L": 10}, r"L must be >= k \(50\), got 10"),
        ({"train_ratio": 0.0}, r"train_ratio must be in \(0, 1\], got 0.0"),
        ({"train_ratio": float("nan")}, r"train_ratio must be in \(0, 1\], got nan"),
        ({"threads": -1}, r"threads must be >= 0, got -1"),
        ({"degree_cap": -2}, r"degree_cap must be >= 0, got -2"),
        ({"expand_width": 0}, r"expand_width must be >= 1, got 0"),
        ({"expand_width": 33}, r"expand_width must be <= 32 for topk, got 33"),
        ({"expand_width": 9, "mode": "dipr"}, r"expand_width must be <= 8 for dipr, got 9"),
        ({"generated_window": 0}, r"generated_window must be >= 1, got 0"),
        ({"generated_window": 4, "mode": "dipr"}, r"generated_window .* needs mode='topk'"),
        ({"warm_start": -1}, r"warm_start must be >= 0, got -1"),
        ({"warm_start": 8, "mode": "dipr"}, r"warm_start needs mode='topk', got mode='dipr'"),
        ({"warm_start": 8, "mode": "auto"}, r"warm_start needs mode='topk', got mode='auto'"),
        ({"walk_through": 1}, r"walk_through must be a bool, got 1"),
        ({"max_hops": -4}, r"max_hops must be >= 0, got -4"),
        ({"add_queries": -1, "generated_window": 2}, r"add_queries must be >= 0, got -1"),
        ({"add_queries": 2}, r"add_queries needs generated_window .* got add_queries=2 without"),
    ],
)
def test_bad_parameters_are_rejected_at_construction(kwargs, message):
    with pytest.raises(ks.InvalidArgument, match=message):
        kt.KvsiftCache(tiny_config(), **kwargs)


def test_window_larger_than_the_prompt_is_rejected_before_anything_is_cached(models):
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=4, window=400)
    with pytest.raises(
        ks.InvalidArgument,
        match=r"sink \(4\) \+ window \(400\) must be smaller than the prompt \(300 tokens\)",
    ):
        generate(model, ids, cache)
    assert cache.get_seq_length() == 0 and not cache.kvsift_layers
    # Exactly the prompt is also too large: no middle token would be left to retrieve.
    with pytest.raises(ks.InvalidArgument, match=r"window \(296\)"):
        generate(model, ids, kt.KvsiftCache(model.config, sink=4, window=296))


def test_misuse_names_the_fix(models):
    model, ids, _ = models
    with pytest.raises(RuntimeError, match="past_key_values=kvsift.transformers.KvsiftCache"):
        with torch.no_grad():
            model(ids[:, :20], past_key_values=transformers.DynamicCache(config=model.config))
    with pytest.raises(ks.InvalidArgument, match="batch size must be 1, got 2"):
        generate(model, ids.repeat(2, 1), kt.KvsiftCache(model.config))
    cache = kt.KvsiftCache(model.config, sink=2, window=8)
    generate(model, ids, cache, new=1)
    with pytest.raises(ks.InvalidArgument, match="needs a new KvsiftCache"):
        with torch.no_grad():
            model(ids[:, :20], past_key_values=cache)


def test_registration_is_visible_to_transformers():
    assert transformers.AttentionInterface._global_mapping[kt.NAME] is kt.kvsift_attention
    kt.register()  # idempotent
    assert transformers.AttentionInterface._global_mapping[kt.NAME] is kt.kvsift_attention


def test_readme_snippet_runs(models):
    """python/README.md's `<!-- pytest: hf-switch -->` block, run as written on the tiny model."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    marker = readme.index("<!-- pytest: hf-switch -->")
    start = readme.index("```python\n", marker) + len("```python\n")
    snippet = readme[start : readme.index("```", start)]
    model, ids, _ = models
    scope = {"model": model, "ids": ids}
    exec(compile(snippet, "python/README.md:hf-switch", "exec"), scope)
    assert scope["out"].shape == (1, PROMPT + 16)
    assert sorted(scope["cache"].kvsift_layers) == [0, 1]


def test_gemma3_sliding_layers_keep_sdpa_and_the_global_layer_is_exact():
    """Gemma-3: three sliding-window layers (SDPA, no index) and one global layer (kvsift);
    with every middle token retrieved the decode equals eager attention."""
    def config():
        return transformers.Gemma3TextConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=1024,
            sliding_window=64,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
        )

    eager, model = eager_and_kvsift(transformers.Gemma3ForCausalLM, config)
    # Token ids from 1: 0 is Gemma's pad token, which generate() masks out.
    ids = torch.randint(1, 256, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = eager.generate(
            ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    cache = kt.KvsiftCache(model.config, sink=4, window=32, k=PROMPT)
    out = generate(model, ids, cache, new=4)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_gap(out, ref) < 1e-5
    assert sorted(cache.kvsift_layers) == [3]
    # A prompt holding the pad token: generate() masks it, which kvsift attention refuses.
    padded = ids.clone()
    padded[0, 100] = 0
    with pytest.raises(ks.InvalidArgument, match="attention mask hides cached tokens"):
        generate(model, padded, kt.KvsiftCache(model.config, sink=4, window=32), new=2)


def test_dipr_covering_every_score_equals_eager(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(
        model.config, sink=4, window=32, mode="dipr", beta=1e6, l0=PROMPT, max_candidates=PROMPT
    )
    out = generate(model, ids, cache)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_gap(out, ref) < 1e-5
    # Every middle token of every head, layer and decode step (NEW - 1 of them) was retrieved.
    assert cache.retrieved == (NEW - 1) * 2 * 4 * (PROMPT - 4 - 32)


def test_dipr_with_a_small_beta_retrieves_fewer_and_runs(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=4, window=32, mode="dipr", beta=0.01)
    out = generate(model, ids, cache)
    assert out.sequences.shape == ref.sequences.shape
    assert 0 < cache.retrieved < (NEW - 1) * 2 * 4 * (PROMPT - 4 - 32) // 4
    assert max_logit_gap(out, ref) > 1e-4


def test_dipr_decode_step_equals_window_seeded_dipr_by_hand(models):
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=3, window=5, mode="dipr", beta=0.075, l0=16)
    generate(model, ids, cache, new=2)
    layer = model.model.layers[0].self_attn
    key, value = cache.layers[0].keys, cache.layers[0].values
    q = torch.randn(1, 4, 1, 16) * 3
    # Heads 0 and 2 point at a window key of their KV head: the window's best score then leads,
    # and the seed must cut the middle tokens that an unseeded DIPR would keep.
    q[0, 0, 0], q[0, 2, 0] = 3 * key[0, 0, PROMPT - 2], 3 * key[0, 1, PROMPT - 2]
    kt._active_cache.set(cache)
    out, _ = kt.kvsift_attention(layer, q, key, value, None, scaling=0.25)
    n, lo, hi = key.shape[2], 3, PROMPT - 5
    for h in range(4):
        g = h // 2
        qh = q[0, h, 0].numpy()
        k_all = key[0, g].numpy()
        window = np.concatenate([np.arange(0, lo), np.arange(hi, n)])
        seed = float((k_all[window] @ qh).max())
        graph = cache.kvsift_layers[0].graphs[g]
        # beta 0.075 in logits is 0.075 / 0.25 = 0.3 in the graph's raw q.k.
        mid = graph.dipr(qh, 0.3, l0=16, seed_score=seed).ids
        if h in (0, 2):
            assert len(mid) < len(graph.dipr(qh, 0.3, l0=16).ids)
        toks = np.concatenate([window, lo + mid])
        logits = 0.25 * (k_all[toks].astype(np.float64) @ qh)
        w = np.exp(logits - logits.max())
        want = (w / w.sum()) @ value[0, g, toks].numpy()
        np.testing.assert_allclose(out[0, 0, h].numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "flat"}, r"mode must be 'topk', 'dipr' or 'auto', got 'flat'"),
        ({"planner": "rules"}, r"planner must be a kvsift.Planner, got str"),
        ({"planner": ks.Planner()}, r"planner is used by mode='auto' only, got mode='topk'"),
        ({"mode": "auto", "gpu_budget_bytes": -1}, r"gpu_budget_bytes must be finite and >= 0"),
        ({"mode": "auto", "generated_window": 2}, r"generated_window .* needs mode='topk'"),
        ({"beta": -1.0}, r"beta must be finite and >= 0 \(logit units\), got -1.0"),
        ({"beta": float("inf")}, r"beta must be finite and >= 0 \(logit units\), got inf"),
        ({"l0": 0}, r"l0 must be >= 1, got 0"),
        ({"max_candidates": -1}, r"max_candidates must be >= 0, got -1"),
    ],
)
def test_bad_dipr_parameters_are_rejected(kwargs, message):
    with pytest.raises(ks.InvalidArgument, match=message):
        kt.KvsiftCache(tiny_config(), **kwargs)


def test_degree_cap_reaches_the_decode_searches(models, monkeypatch):
    """degree_cap is passed to search_heads and to the batched DIPR call."""
    model, ids, _ = models
    seen = []

    def spy(fn):
        return lambda *a, **kw: seen.append(kw["degree_cap"]) or fn(*a, **kw)

    monkeypatch.setattr(kt._ks, "search_heads", spy(ks.search_heads))
    generate(model, ids, kt.KvsiftCache(model.config, sink=4, window=32, k=8, degree_cap=3), new=2)
    monkeypatch.setattr(kt._ks, "dipr_heads", spy(ks.dipr_heads))
    cache = kt.KvsiftCache(model.config, sink=4, window=32, mode="dipr", beta=0.01, degree_cap=5)
    generate(model, ids, cache, new=2)
    assert seen == [3, 3, 5, 5]  # 2 layers x 1 step, top-k then DIPR


def test_warm_start_seeds_each_step_with_the_last_steps_ids(models, monkeypatch):
    """warm_start=E: a layer's first decode step searches cold, every later one from the ids its
    previous step retrieved (entries) with expand_limit min(E, L); without it, always cold."""
    model, ids, _ = models
    calls = []

    def spy(indexes, q, k, **kw):
        r = ks.search_heads(indexes, q, k, **kw)
        calls.append((kw.get("entries"), kw.get("expand_limit"), r.ids.copy()))
        return r

    monkeypatch.setattr(kt._ks, "search_heads", spy)
    generate(model, ids, kt.KvsiftCache(model.config, sink=2, window=8, k=4, L=16, warm_start=6),
             new=4)
    assert len(calls) == 2 * 3  # 2 layers x 3 decode steps (the first token is the prefill's)
    for layer in range(2):
        mine = calls[layer::2]
        assert mine[0][0] is None and mine[0][1] == 0
        for before, now in zip(mine, mine[1:]):
            np.testing.assert_array_equal(now[0], before[2])
            assert now[1] == 6
    calls.clear()
    generate(model, ids, kt.KvsiftCache(model.config, sink=2, window=8, k=4, L=16, warm_start=99),
             new=3)
    assert [c[1] for c in calls] == [0, 0, 16, 16]  # the limit is at most L
    calls.clear()
    generate(model, ids, kt.KvsiftCache(model.config, sink=2, window=8, k=4, L=16), new=3)
    assert all(c[0] is None and c[1] == 0 for c in calls)


def test_warm_started_decode_step_equals_the_seeded_search_by_hand(models):
    """A warm step of one layer against kvsift's per-head calls written out: the middle from each
    KV head's graph searched from the head's previous ids, expanding the best E entries."""
    model, ids, _ = models
    cache = kt.KvsiftCache(model.config, sink=3, window=5, k=7, L=32, warm_start=2)
    generate(model, ids, cache, new=2)
    layer = model.model.layers[1].self_attn
    key, value = cache.layers[1].keys, cache.layers[1].values
    seeds = cache.kvsift_layers[1].previous.copy()
    assert seeds.shape == (4, 7)
    q = torch.randn(1, 4, 1, 16)
    kt._active_cache.set(cache)
    out, _ = kt.kvsift_attention(layer, q, key, value, None, scaling=0.25)
    n, lo, hi = key.shape[2], 3, PROMPT - 5
    seeded_differs = False
    for h in range(4):
        g = h // 2
        graph = cache.kvsift_layers[1].graphs[g]
        qh = q[0, h, 0].numpy()
        mid = ks.search_heads([graph], qh[None], 7, L=32, entries=seeds[h : h + 1],
                              expand_limit=2).ids[0]
        cold = ks.search_heads([graph], qh[None], 7, L=32, expand_limit=2).ids[0]
        seeded_differs |= not np.array_equal(np.sort(mid), np.sort(cold))
        np.testing.assert_array_equal(cache.kvsift_layers[1].previous[h], mid)
        toks = np.concatenate([np.arange(0, lo), lo + mid, np.arange(hi, n)])
        want = attention_by_hand(qh, key[0, g, toks].numpy(), value[0, g, toks].numpy(), 0.25)
        np.testing.assert_allclose(out[0, 0, h].numpy(), want, rtol=1e-5, atol=1e-6)
    # The seeds matter here: the limited walk from them retrieves other tokens than the same
    # walk started cold for some head (else this test could not tell the two apart).
    assert seeded_differs


@pytest.mark.parametrize(
    "budget, plans",
    [
        # No GPU budget: DIPR, on the flat index in layer 0 and on the graph after (beta covers
        # every score); a large budget: coarse top-k, 64 blocks of 16 tokens (every middle one).
        (0.0, {0: "flat-dipr", 1: "graph-dipr"}),
        (1e9, {0: "coarse-topk", 1: "coarse-topk"}),
    ],
)
def test_auto_mode_runs_the_planners_choice_and_a_covering_plan_equals_eager(
    models, monkeypatch, budget, plans
):
    model, ids, ref = models
    executed = []
    real = ks.execute_plan
    monkeypatch.setattr(kt._ks, "execute_plan", lambda p, *a, **kw: executed.append(p.name) or real(p, *a, **kw))
    planner = ks.Planner(short_context=64, head_dim=16, block_size=16, k_blocks=64, dipr_beta=1e6,
                         dipr_l0=PROMPT)
    cache = kt.KvsiftCache(model.config, sink=4, window=32, mode="auto", planner=planner,
                           gpu_budget_bytes=budget, max_candidates=PROMPT)
    out = generate(model, ids, cache)
    assert cache.plans == plans
    # (NEW - 1) decode steps x 2 layers x 4 query heads, each through the planned executor.
    assert sorted(set(executed)) == sorted(set(plans.values()))
    assert len(executed) == (NEW - 1) * 2 * 4
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_gap(out, ref) < 1e-5
    assert cache.retrieved == (NEW - 1) * 2 * 4 * (PROMPT - 4 - 32)


def test_auto_mode_short_context_is_full_attention_and_a_small_beta_differs(models):
    model, ids, ref = models
    cache = kt.KvsiftCache(model.config, sink=4, window=32, mode="auto")  # short_context 4096
    out = generate(model, ids, cache)
    assert set(cache.plans.values()) == {"full-full"}
    assert max_logit_gap(out, ref) < 1e-5
    planner = ks.Planner(short_context=64, head_dim=16, dipr_beta=0.05)
    cache = kt.KvsiftCache(model.config, sink=4, window=32, mode="auto", planner=planner)
    out = generate(model, ids, cache)
    assert cache.plans == {0: "flat-dipr", 1: "graph-dipr"}
    assert 0 < cache.retrieved < (NEW - 1) * 2 * 4 * (PROMPT - 4 - 32) // 4
    assert max_logit_gap(out, ref) > 1e-4


def test_auto_mode_step_equals_window_seeded_exact_dipr_by_hand(models):
    """Layer 0's plan is DIPR on the flat index (exact): the step must equal attention over the
    window [0, sink) + [prompt - window, n) plus every middle token within the plan's beta (raw
    q.k) of the best score of the whole context, window included."""
    model, ids, _ = models
    planner = ks.Planner(short_context=64, head_dim=16, dipr_beta=0.3)
    cache = kt.KvsiftCache(model.config, sink=3, window=5, mode="auto", planner=planner)
    generate(model, ids, cache, new=2)
    layer = model.model.layers[0].self_attn
    key, value = cache.layers[0].keys, cache.layers[0].values
    q = torch.randn(1, 4, 1, 16) * 3
    q[0, 0, 0], q[0, 2, 0] = 3 * key[0, 0, PROMPT - 2], 3 * key[0, 1, PROMPT - 2]  # window leads
    kt._active_cache.set(cache)
    out, _ = kt.kvsift_attention(layer, q, key, value, None, scaling=0.25)
    assert cache.plans[0] == "flat-dipr"
    n, lo, hi = key.shape[2], 3, PROMPT - 5
    window = np.concatenate([np.arange(0, lo), np.arange(hi, n)])
    for h in range(4):
        g = h // 2
        qh = q[0, h, 0].numpy().astype(np.float64)
        scores = key[0, g].numpy().astype(np.float64) @ qh
        best = scores.max()  # over the whole context: the window's best seeds the search
        mid = np.arange(lo, hi)[scores[lo:hi] >= best - 0.3]
        toks = np.concatenate([window, mid])
        logits = 0.25 * scores[toks]
        w = np.exp(logits - logits.max())
        want = (w / w.sum()) @ value[0, g, toks].numpy()
        np.testing.assert_allclose(out[0, 0, h].numpy(), want, rtol=1e-5, atol=1e-6)
