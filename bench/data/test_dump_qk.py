"""Bad input of bench/data/dump_qk.py: non-zero exit, a clear message, no files written.

Builds tiny GGUF files with the gguf package's writer (no model is needed or downloaded) and
runs the script as a subprocess. Skips cleanly when numpy / gguf / regex are not importable.

    python3 -m pytest bench/data/test_dump_qk.py
"""
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
pytest.importorskip("regex")

SCRIPT = Path(__file__).resolve().parent / "dump_qk.py"


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


def test_missing_gguf(tmp_path):
    r = run(tmp_path, "--gguf", str(tmp_path / "nope.gguf"))
    assert r.returncode != 0
    assert "GGUF file not found" in r.stderr and "nope.gguf" in r.stderr


@pytest.mark.parametrize("content", [b"", b"GGUF" + b"\x00" * 7, b"not a model at all" * 50])
def test_corrupt_gguf(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    r = run(tmp_path, "--gguf", str(bad))
    assert r.returncode != 0
    assert "corrupt or not a GGUF file" in r.stderr


def test_truncated_gguf(tmp_path):
    good = write_gguf(tmp_path / "good.gguf")
    data = good.read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) // 2])
    r = run(tmp_path, "--gguf", str(bad))
    assert r.returncode != 0
    assert "corrupt or not a GGUF file" in r.stderr


def test_unsupported_architecture(tmp_path):
    model = write_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    r = run(tmp_path, "--gguf", str(model))
    assert r.returncode != 0
    assert "unsupported architecture 'gpt2'" in r.stderr


def test_text_shorter_than_asked(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf", n_ctx=4096)
    text = tmp_path / "short.txt"
    text.write_text("hello world, a short text")
    r = run(tmp_path, "--gguf", str(model), "--text", str(text), "--tokens", "1000",
            "--layers", "0")
    assert r.returncode != 0
    assert "text too short" in r.stderr and "--tokens 1000" in r.stderr


def test_tokens_beyond_context(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf", n_ctx=64)
    text = tmp_path / "t.txt"
    text.write_text("word " * 500)
    r = run(tmp_path, "--gguf", str(model), "--text", str(text), "--tokens", "65")
    assert r.returncode != 0
    assert "exceeds the model context length 64" in r.stderr


def test_bad_layer_list(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    r = run(tmp_path, "--gguf", str(model), "--layers", "7")
    assert r.returncode != 0
    assert "--layers must be in [0, 2)" in r.stderr
