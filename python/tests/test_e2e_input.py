"""Bad input of the end-to-end example (examples/python/e2e_generation.py): a prompt longer
than the model context and a window larger than the prompt raise before any model work.
(An index for another head dim is tested in test_kvsift.py.) Also: the planner ("auto") mode
runs what the planner picks, checked against full attention on a random KV cache."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e():
    path = ROOT / "examples" / "python" / "e2e_generation.py"
    spec = importlib.util.spec_from_file_location("e2e_generation", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports bench/data/dump_qk.py (numpy only at import time)
    return mod


def test_prompt_fitting_the_context_is_accepted(e2e):
    e2e.check_fits(8185, 7, 8192)
    e2e.check_fits(641, 1, 8192)


def test_prompt_longer_than_context_raises(e2e):
    with pytest.raises(e2e.E2EError, match="prompt of 8190 tokens \\+ 7 new tokens exceeds the model context 8192"):
        e2e.check_fits(8190, 7, 8192)
    with pytest.raises(ValueError):
        e2e.check_fits(9000, 0, 8192)


def test_window_larger_than_prompt_raises(e2e):
    with pytest.raises(e2e.E2EError, match="window of 128 \\+ 512 tokens is not smaller than the prompt \\(600 tokens\\)"):
        e2e.check_fits(600, 7, 8192)
    with pytest.raises(e2e.E2EError, match="window of 128 \\+ 512"):
        e2e.check_fits(640, 7, 8192)
    with pytest.raises(e2e.E2EError, match="window of 16 \\+ 64"):
        e2e.check_fits(50, 1, 8192, sink=16, recent=64)


# ------------------------------------------------------------------------- planner ("auto") mode


def make_decoder(e2e, planner, n=800, d=16, layers=2, budget=0.0):
    """A Decoder over a random KV cache (no model: only attend() is exercised), GQA group 2."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(n_layer=layers, n_head=2, n_head_kv=1, group=2, head_dim=d, rope_dim=d, rope_base=1e4)
    dec = e2e.Decoder(None, cfg, n, {"nq": 10, "M": 8, "L": 32, "ratio": 0.5}, beta=1e4, topk=10, search_L=20,
                      planner=planner, gpu_budget=budget)
    rng = np.random.default_rng(5)
    dec.k[:] = rng.standard_normal(dec.k.shape).astype(np.float32)
    dec.v[:] = rng.standard_normal(dec.v.shape).astype(np.float32)
    for il in range(layers):
        dec.build_indexes(il, rng.standard_normal((n, 2, d)).astype(np.float32), n)
    dec.n_indexed = n
    return dec, rng


def full_attention(k, v, q):
    s = (k.astype(np.float64) @ q.astype(np.float64)) / np.sqrt(len(q))
    p = np.exp(s - s.max())
    return (p @ v.astype(np.float64)) / p.sum()


@pytest.mark.parametrize("budget, short, expected",
                         [(0.0, 100, ["flat-dipr", "graph-dipr"]),  # tight budget: DIPR
                          (1e9, 100, ["coarse-topk", "coarse-topk"]),  # coarse fits
                          (0.0, 4096, ["full-full", "full-full"])])  # short context
def test_auto_mode_runs_the_planned_method(e2e, budget, short, expected):
    import kvsift as ks

    # k_blocks * block_size covers the context and beta is huge, so every plan attends to
    # every token and must reproduce full attention (numpy oracle) exactly.
    planner = ks.Planner(short_context=short, head_dim=16, block_size=64, k_blocks=13, dipr_beta=1e4)
    dec, rng = make_decoder(e2e, planner, budget=budget)
    n = 800
    for il in range(2):
        q = rng.standard_normal((2, 16)).astype(np.float32)
        stats = {"search": 0.0, "attention": 0.0, "attended": 0, "scanned": 0, "head_steps": 0}
        out = dec.attend("auto", il, q, n, stats)
        assert dec.plans_seen[il].split(" ")[0] == expected[il]
        for h in range(2):
            np.testing.assert_allclose(out[h], full_attention(dec.k[il, :n, 0], dec.v[il, :n, 0], q[h]), rtol=2e-4,
                                       atol=2e-5)
        assert stats["attended"] == 2 * n and stats["head_steps"] == 2


def test_auto_mode_tight_budget_attends_a_subset(e2e):
    import kvsift as ks

    planner = ks.Planner(short_context=100, head_dim=16, dipr_beta=2.0)
    dec, rng = make_decoder(e2e, planner, budget=0.0)
    stats = {"search": 0.0, "attention": 0.0, "attended": 0, "scanned": 0, "head_steps": 0}
    dec.attend("auto", 1, rng.standard_normal((2, 16)).astype(np.float32), 800, stats)
    assert dec.plans_seen[1].startswith("graph-dipr")
    assert 2 * 640 <= stats["attended"] < 2 * 800  # the window plus a DIPR subset of the middle
    assert stats["scanned"] > 0


# ------------------------------------------------------------------------- Gemma-3 decoding


@pytest.mark.parametrize("mode", ["full", "window+topk", "window+dipr"])
def test_gemma3_decode_steps_reproduce_the_forward_pass(e2e, mode):
    """Teacher-forced decode steps of Gemma3Decoder (KV cache, local sliding windows, global
    layers through kvsift) give the logits of the full numpy pass at every position. The
    retrieval modes retrieve the whole middle here (top-100 of ~60 tokens; DIPR with a huge
    beta), so they must agree to rounding: a wrong attention scale, embedding scale, RoPE table
    or local window, or a retrieval that loses the middle, changes the logits."""
    from tiny_gemma import FakeWeights, tiny_gemma

    rng = np.random.default_rng(3)
    cfg, t = tiny_gemma(rng, n_layer=3, n_embd=16, n_head=2, n_head_kv=1, d=8, vocab=40)
    conv = e2e.model.GemmaConventions(swa_period=3, block=64)  # layers 0, 1 local (window 3); 2 global
    n_total, n_prefill = 700, 680
    ids = rng.integers(0, 40, n_total).tolist()
    hidden, _ = e2e.model.gemma3_forward(FakeWeights(t), cfg, ids, set(), conv, lambda m: None)
    logits = hidden @ t["token_embd.weight"].T

    dec = e2e.Gemma3Decoder(FakeWeights(t), cfg, n_total, {"nq": 10, "M": 8, "L": 64, "ratio": 0.5}, 1e4, 100, 200,
                            conv=conv)
    dec.prefill(ids[:n_prefill])
    assert len(dec.graphs[2]) == 1 and dec.graphs[0] == dec.graphs[1] == []  # indexes in the global layer only
    stats = {"search": 0.0, "attention": 0.0, "attended": 0, "scanned": 0, "head_steps": 0}
    for pos in range(n_prefill, n_total):
        np.testing.assert_allclose(dec.logits(ids[pos], pos, mode, stats), logits[pos], rtol=1e-4, atol=1e-4)
    assert stats["head_steps"] == 2 * (n_total - n_prefill)  # the global layer's heads only
    if mode != "full":
        middle = [n - 512 - 128 for n in range(n_prefill + 1, n_total + 1)]
        assert stats["attended"] == sum(2 * (640 + m) for m in middle)  # window + the whole middle
