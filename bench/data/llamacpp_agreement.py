#!/usr/bin/env python3
"""Agreement of dump_qk.py's numpy Gemma-3 pass with llama.cpp on the same GGUF and tokens.

dump_qk.py implements Gemma-3 from the GGUF file itself (every convention settled by
perplexity, see its docstring). This script runs an independent implementation of the same
file, llama.cpp through the PyPI package ``llama-cpp-python`` (which builds llama.cpp from
source: about half an hour on two cores; run once, never in CI), on exactly the token ids the
numpy pass scored, and compares, over the same positions:

- perplexity (the numpy pass's vs llama.cpp's; target: within 2%),
- top-1 agreement (the share of positions where both predict the same next token; target:
  >= 95%), and each one's next-token accuracy,
- the mean and largest |difference| of the log-probability of the true next token.

Input: the ``.npz`` dump_qk.py writes with ``--predictions`` (token ids, scored positions, the
numpy pass's log-probabilities and top-1 tokens). llama.cpp evaluates the whole sequence in
batches of ``--batch`` tokens with logits requested only at the scored positions (a 32K x 262144
logit matrix would be 34 GB), with its defaults otherwise (f16 KV cache).

    python3 bench/data/dump_qk.py --gguf G --tokens 32768 --ppl-stride 8 --layers 5 \\
        --out /tmp/gemma32k_pred --predictions /tmp/gemma32k_pred.npz
    python3 bench/data/llamacpp_agreement.py --gguf G --predictions /tmp/gemma32k_pred.npz \\
        --json bench/results/gemma3_llamacpp_agreement.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import time

import numpy as np


def _fn(lib, *names):
    """The first of `names` that this llama-cpp-python version exports (the C API renamed
    several functions between releases)."""
    for n in names:
        if hasattr(lib, n):
            return getattr(lib, n)
    raise AttributeError(f"llama_cpp has none of {names}")


def llama_logprobs(gguf: str, ids: np.ndarray, rows: np.ndarray, batch: int, threads: int):
    """llama.cpp's log-probability of token t+1 and its top-1 token at every position t in rows."""
    import llama_cpp as L

    L.llama_backend_init()
    model = _fn(L, "llama_model_load_from_file", "llama_load_model_from_file")(
        gguf.encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf}")
    cp = L.llama_context_default_params()
    cp.n_ctx = int(len(ids))
    cp.n_batch = batch
    cp.n_ubatch = batch
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = _fn(L, "llama_init_from_model", "llama_new_context_with_model")(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    if hasattr(L, "llama_model_get_vocab"):
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    else:
        n_vocab = L.llama_n_vocab(model)
    want = np.zeros(len(ids), dtype=bool)
    want[rows] = True
    logprob = np.empty(len(rows), dtype=np.float64)
    argmax = np.empty(len(rows), dtype=np.int64)
    at = {int(t): i for i, t in enumerate(rows)}
    b = L.llama_batch_init(batch, 0, 1)
    try:
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            b.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                b.token[i] = int(tok)
                b.pos[i] = start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = bool(want[start + i])
            rc = L.llama_decode(ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} at position {start}")
            for i in range(len(chunk)):
                t = start + i
                if not want[t]:
                    continue
                ptr = L.llama_get_logits_ith(ctx, i)
                logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                               shape=(n_vocab,)).astype(np.float64)
                m = logits.max()
                lse = m + math.log(np.exp(logits - m).sum())
                j = at[t]
                logprob[j] = logits[int(ids[t + 1])] - lse
                argmax[j] = int(logits.argmax())
    finally:
        L.llama_batch_free(b)
        L.llama_free(ctx)
        _fn(L, "llama_model_free", "llama_free_model")(model)
    return logprob, argmax


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--predictions", required=True, help="dump_qk.py --predictions output (.npz)")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    p = np.load(a.predictions)
    ids, rows = p["ids"], p["rows"]
    targets = ids[rows + 1]
    t0 = time.time()
    lp, am = llama_logprobs(a.gguf, ids, rows, a.batch, a.threads)
    seconds = time.time() - t0
    import llama_cpp

    ppl_np, ppl_ll = math.exp(-p["logprob"].mean()), math.exp(-lp.mean())
    diff = np.abs(lp - p["logprob"])
    out = {
        "tokens": int(len(ids)),
        "scored_positions": int(len(rows)),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "perplexity_numpy": round(ppl_np, 4),
        "perplexity_llama_cpp": round(ppl_ll, 4),
        "perplexity_ratio_numpy_over_llama_cpp": round(ppl_np / ppl_ll, 4),
        "top1_agreement": round(float((am == p["argmax"]).mean()), 4),
        "next_token_accuracy_numpy": round(float((p["argmax"] == targets).mean()), 4),
        "next_token_accuracy_llama_cpp": round(float((am == targets).mean()), 4),
        "logprob_abs_diff_mean": round(float(diff.mean()), 4),
        "logprob_abs_diff_max": round(float(diff.max()), 4),
        "llama_cpp_seconds": round(seconds, 1),
        "threads": a.threads,
    }
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
