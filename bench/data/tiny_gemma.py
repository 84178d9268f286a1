"""A tiny randomly initialised Gemma-3 (tensors named as in the GGUF) for tests of the numpy
pass (bench/data/test_dump_qk.py) and of the end-to-end decoder (python/tests/test_e2e_input.py).
numpy only."""

import numpy as np

import dump_qk as D


class FakeWeights:
    def __init__(self, tensors):
        self.t = tensors

    def get(self, name):
        return self.t[name].copy()

    def has(self, name):
        return name in self.t


def tiny_gemma(rng, n_layer=3, n_embd=12, n_head=2, n_head_kv=1, d=4, n_ff=10, vocab=30):
    cfg = D.ModelConfig(n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, n_embd=n_embd, n_ff=n_ff, n_ctx=64,
                        rope_base=1000.0, rope_dim=d, rms_eps=1e-6, name="tiny", arch="gemma3", key_length=d,
                        sliding_window=3, rope_base_local=10.0, attn_scale=0.3)
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.5  # noqa: E731
    t = {"token_embd.weight": r(vocab, n_embd), "output_norm.weight": 1 + r(n_embd)}
    for il in range(n_layer):
        p = f"blk.{il}."
        t.update({p + "attn_norm.weight": 1 + r(n_embd), p + "attn_q.weight": r(n_head * d, n_embd),
                  p + "attn_k.weight": r(n_head_kv * d, n_embd), p + "attn_v.weight": r(n_head_kv * d, n_embd),
                  p + "attn_q_norm.weight": 1 + r(d), p + "attn_k_norm.weight": 1 + r(d),
                  p + "attn_output.weight": r(n_embd, n_head * d), p + "post_attention_norm.weight": 1 + r(n_embd),
                  p + "ffn_norm.weight": 1 + r(n_embd), p + "ffn_gate.weight": r(n_ff, n_embd),
                  p + "ffn_up.weight": r(n_ff, n_embd), p + "ffn_down.weight": r(n_embd, n_ff),
                  p + "post_ffw_norm.weight": 1 + r(n_embd)})
    return cfg, t
