#!/usr/bin/env python3
"""Decode-step time of kvsift.transformers with generated tokens kept in the exact window
(default) against inserted into the indexes (``KvsiftCache(generated_window=G)``), over a long
generation, on the CPU with a randomly initialised Llama (the weights do not change the cost).

Both caches run the same prompt and generate the same number of tokens, alternated in one
process; reported per variant: the mean decode-step time over each quarter of the generation
(the window's growth shows up as a rising step time) and the final exact-window size.

Usage: generated_window.py [--prompt 4096] [--new 1024] [--window 64] [--G 64] [--rounds 2]
Needs torch and transformers.
"""

import argparse
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--G", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    import torch
    import transformers

    import kvsift.transformers as kt

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=a.prompt + a.new + 8)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation(kt.NAME)
    ids = torch.randint(0, 512, (1, a.prompt), generator=torch.Generator().manual_seed(1))

    def run(G):
        cache = kt.KvsiftCache(model.config, sink=4, window=a.window, k=100, generated_window=G)
        steps = []
        with torch.no_grad():
            out = model(ids, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            for _ in range(a.new - 1):
                t = time.perf_counter()
                out = model(tok, past_key_values=cache, use_cache=True)
                steps.append(time.perf_counter() - t)
                tok = out.logits[:, -1:].argmax(-1)
        state = next(iter(cache.kvsift_layers.values()))
        exact = 4 + a.window + (a.new - 1 - state.inserted)
        return steps, exact

    print(f"# Llama 2 layers x 8 heads (2 KV heads, d 64), prompt {a.prompt}, {a.new} new tokens, "
          f"sink 4 + window {a.window}, top-100; torch {torch.__version__}, 1 thread")
    for r in range(a.rounds):
        for G in (None, a.G):
            steps, exact = run(G)
            q = len(steps) // 4
            means = [1e3 * sum(steps[i * q:(i + 1) * q]) / q for i in range(4)]
            label = "window keeps all" if G is None else f"generated_window={G}"
            print(f"round {r} {label:20s} step ms by quarter " + " ".join(f"{m:6.2f}" for m in means)
                  + f"   exact tokens at the end {exact}")


if __name__ == "__main__":
    main()
